/* The kv codec's order-1 Huffman decoder, included by _kvcore.c once per MULTI (the most
 * symbols one table look-up decodes): eight suits sections of few bits per symbol, four keeps
 * the tables of sections with more bits per symbol small enough to stay in cache.
 * VARIANT(name) names this copy's types and function. */
/* A multi-symbol table entry: up to MULTI symbols, the table of the context after them, how
 * many symbols (0 where no code starts with these bits: the stream stops moving and the caller
 * notices) and the bits they take. A single-symbol entry: symbol (bits 0-7), length (8-15; 0:
 * no code). */
#if MULTI == 8
typedef uint64_t VARIANT(Syms);
typedef u64u VARIANT(SymsU);
#elif MULTI == 4
typedef uint32_t VARIANT(Syms);
typedef u32u VARIANT(SymsU);
#else
#error "MULTI is 4 or 8"
#endif
typedef struct {
    VARIANT(Syms) syms;
    uint16_t next;
    uint8_t count, bits;
} VARIANT(Entry);
#define Entry VARIANT(Entry)
#define SymsU VARIANT(SymsU)
#define TABLE_BYTES ((size_t)TABSIZE * sizeof(Entry))

/* Decode the section (``len`` bytes followed by PAD readable zero bytes) into n symbols. */
static int
VARIANT(decode_o1)(const uint8_t *sec, size_t len, uint8_t *out, size_t n)
{
    if (len < HEAD_BYTES)
        return E_SHORT;
    if (sec[0] != VERSION || sec[1] != MAXBITS || sec[2] != NSTREAMS || sec[3] > 7)
        return E_HEAD;
    const unsigned shift = sec[3];
    if (load32(sec + 4) != (uint32_t)n || load32(sec + 8) != (uint32_t)((uint64_t)n >> 32))
        return E_COUNT;
    const uint8_t *ctxmap = sec + 12;
    if (ctxmap[32] & 0xfe)
        return E_HEAD;
    const uint8_t *p = sec + HEAD_BYTES, *end = sec + len;
    int ntab = 1, table_of[NCTX];
    for (int c = 0; c < NCTX; c++)
        table_of[c] = (ctxmap[c >> 3] >> (c & 7)) & 1 ? ntab++ : 0;
    /* multi: the look-up tables; narrow: the same for every narrower window of w < MAXBITS
     * bits (ntab << w entries each); single: one symbol per look-up; lens_of: code lengths */
    size_t nt = (size_t)ntab, sz_multi = nt * TABSIZE * sizeof(Entry),
           sz_narrow = nt * (TABSIZE - 1) * sizeof(Entry), sz_single = nt * TABSIZE * 2;
    int owned;
    char *mem = scratch_get(SCRATCH_TABLES, sz_multi + sz_narrow + sz_single + nt * 256, &owned);
    if (!mem)
        return E_MEMORY;
    Entry *multi = (Entry *)mem, *narrow = (Entry *)(mem + sz_multi);
    uint16_t *single = (uint16_t *)(mem + sz_multi + sz_narrow);
    uint8_t(*lens_of)[256] = (uint8_t(*)[256])(mem + sz_multi + sz_narrow + sz_single);
    memset(single, 0, sz_single);
    int rc = OK;
    for (int t = 0; t < ntab; t++) {
        if (end - p < 32) {
            rc = E_SHORT;
            goto done;
        }
        const uint8_t *bitmap = p;
        p += 32;
        uint8_t *lens = lens_of[t];
        unsigned codes[256];
        int half = 0;
        for (int s = 0; s < 256; s++) {
            lens[s] = 0;
            if (!((bitmap[s >> 3] >> (s & 7)) & 1))
                continue;
            if (p >= end) {
                rc = E_SHORT;
                goto done;
            }
            lens[s] = half ? *p++ >> 4 : *p & 15;
            half ^= 1;
            if (lens[s] == 0) {
                rc = E_TABLE;
                goto done;
            }
        }
        if (half)
            p++;
        if (!canonical_codes(lens, codes)) {
            rc = E_TABLE;
            goto done;
        }
        uint16_t *tab = single + (size_t)t * TABSIZE;
        for (int s = 0; s < 256; s++)
            for (unsigned j = codes[s]; lens[s] && j < TABSIZE; j += 1u << lens[s])
                tab[j] = (uint16_t)(s | lens[s] << 8);
    }
    /* Window by window, narrowest first: the entry of pattern y in a w-bit window is its
     * first symbol (when its code fits) followed by the entry of the rest of the bits in the
     * narrower window after it, cut to MULTI symbols. */
    Entry *win[MAXBITS + 1];
    for (int w = 0, at = 0; w < MAXBITS; at += 1 << w, w++)
        win[w] = narrow + (size_t)ntab * (size_t)at;
    win[MAXBITS] = multi;
    for (int w = 0; w <= MAXBITS; w++) {
        for (int t = 0; t < ntab; t++) {
            Entry *row = win[w] + ((size_t)t << w);
            for (unsigned y = 0; y < 1u << w; y++) {
                uint16_t e = single[(size_t)t * TABSIZE + y];
                unsigned l = e >> 8, s1 = e & 255;
                Entry d = {0, (uint16_t)t, 0, 0};
                if (l && (int)l <= w) {
                    unsigned t2 = (unsigned)table_of[s1 >> shift];
                    const Entry *r = win[w - l] + ((size_t)t2 << (w - l)) + (y >> l);
                    d.syms = s1 | r->syms << 8; /* drops r's symbol MULTI, if it has one */
                    d.count = (uint8_t)(1 + r->count);
                    d.bits = (uint8_t)(l + r->bits);
                    d.next = (uint16_t)(r->count ? r->next : t2);
                    if (d.count > MULTI) { /* give back the last symbol's bits */
                        unsigned last = (unsigned)(r->syms >> (8 * (MULTI - 1))) & 255;
                        unsigned prev = (unsigned)(d.syms >> (8 * (MULTI - 1))) & 255;
                        unsigned tl = (unsigned)table_of[prev >> shift];
                        d.count = MULTI;
                        d.bits = (uint8_t)(d.bits - lens_of[tl][last]);
                        d.next = (uint16_t)tl;
                    }
                }
                row[y] = d;
            }
        }
    }
    if (end - p < 4 * NSTREAMS) {
        rc = E_SHORT;
        goto done;
    }
    const uint8_t *base[NSTREAMS];
    uint64_t limit[NSTREAMS]; /* bits of each stream */
    const uint8_t *q = p + 4 * NSTREAMS;
    for (int i = 0; i < NSTREAMS; i++) {
        size_t l = load32(p + 4 * i);
        if ((size_t)(end - q) < l) {
            rc = E_STREAMS;
            goto done;
        }
        base[i] = q;
        limit[i] = (uint64_t)l * 8;
        q += l;
    }
    if (q != end) {
        rc = E_STREAMS;
        goto done;
    }
    size_t start[NSTREAMS + 1];
    stream_bounds(n, start);
    /* each stream's bit reader: the next bits in buf (avail of them), refilled from rp */
    const uint8_t *rp[NSTREAMS];
    uint64_t buf[NSTREAMS];
    unsigned avail[NSTREAMS];
    const char *tab[NSTREAMS], *tables = (const char *)multi;
    uint8_t *o[NSTREAMS];
    for (int i = 0; i < NSTREAMS; i++) {
        rp[i] = base[i];
        buf[i] = 0;
        avail[i] = 0;
        tab[i] = tables + (size_t)table_of[START] * TABLE_BYTES;
        o[i] = out + start[i];
    }
    /* LANES slots decode together; a stream leaves its slot when it has no room left for a
     * round of look-ups and the next stream takes it, or an idle lane that decodes zeros
     * into a sink (so the slots stay in lockstep however the streams' sizes differ). */
    static const uint8_t zeros[8 * CHECK_EVERY + 8];
    uint8_t sink[MULTI * PER_REFILL * CHECK_EVERY + 8];
    const uint8_t *s_rp[LANES];
    uint64_t s_buf[LANES];
    unsigned s_avail[LANES];
    const char *s_tab[LANES];
    uint8_t *s_o[LANES], *s_end[LANES];
    int s_id[LANES], next = 0;
    for (int j = 0; j < LANES; j++)
        s_id[j] = -1;
    for (;;) {
        int active = 0;
        for (int j = 0; j < LANES; j++) { /* retire streams short of a round, fill slots */
            if (s_id[j] >= 0 && (size_t)(s_end[j] - s_o[j]) < MULTI * PER_REFILL) {
                int i = s_id[j];
                rp[i] = s_rp[j], buf[i] = s_buf[j], avail[i] = s_avail[j];
                tab[i] = s_tab[j], o[i] = s_o[j];
                s_id[j] = -1;
            }
            while (s_id[j] < 0 && next < NSTREAMS) {
                int i = next++;
                if ((size_t)(out + start[i + 1] - o[i]) < MULTI * PER_REFILL)
                    continue;
                s_rp[j] = rp[i], s_buf[j] = buf[i], s_avail[j] = avail[i];
                s_tab[j] = tab[i], s_o[j] = o[i], s_end[j] = out + start[i + 1];
                s_id[j] = i;
            }
            active += s_id[j] >= 0;
        }
        if (!active)
            break;
        size_t room = SIZE_MAX;
        for (int j = 0; j < LANES; j++) {
            if (s_id[j] < 0) {
                s_rp[j] = zeros, s_buf[j] = 0, s_avail[j] = 0, s_tab[j] = tables;
                s_o[j] = sink;
                continue;
            }
            size_t r = (size_t)(s_end[j] - s_o[j]);
            room = r < room ? r : room;
        }
        size_t rounds = room / (MULTI * PER_REFILL);
        rounds = rounds < CHECK_EVERY ? rounds : CHECK_EVERY;
        uint8_t *before[LANES];
        for (int j = 0; j < LANES; j++)
            before[j] = s_o[j];
        for (size_t k = 0; k < rounds; k++) {
            for (int j = 0; j < LANES; j++) {
                s_buf[j] |= *(const u64u *)s_rp[j] << s_avail[j];
                s_rp[j] += (63 - s_avail[j]) >> 3;
                s_avail[j] |= 56;
            }
            for (int r = 0; r < PER_REFILL; r++)
                for (int j = 0; j < LANES; j++) {
                    const Entry *e = (const Entry *)(s_tab[j]) + (s_buf[j] & (TABSIZE - 1));
                    *(SymsU *)s_o[j] = e->syms;
                    s_o[j] += e->count;
                    s_buf[j] >>= e->bits;
                    s_avail[j] -= e->bits;
                    s_tab[j] = tables + e->next * TABLE_BYTES;
                }
        }
        /* a stream on a pattern no code starts with stops moving: it shows as a lane that
         * decoded fewer symbols than look-ups, here or in a later round */
        unsigned bad = 0;
        for (int j = 0; j < LANES; j++) {
            if (s_id[j] < 0)
                continue;
            int i = s_id[j];
            bad |= ((uint64_t)(s_rp[j] - base[i]) * 8 - s_avail[j] > limit[i]) |
                   ((size_t)(s_o[j] - before[j]) < rounds * PER_REFILL);
        }
        if (bad) {
            rc = E_DATA;
            goto done;
        }
    }
#define CONSUMED(i) ((uint64_t)(rp[i] - base[i]) * 8 - avail[i])
#define REFILL(i)                                                                             \
    do {                                                                                      \
        buf[i] |= *(const u64u *)rp[i] << avail[i];                                           \
        rp[i] += (63 - avail[i]) >> 3;                                                        \
        avail[i] |= 56;                                                                       \
    } while (0)
    for (int i = 0; i < NSTREAMS; i++) { /* each stream's last symbols, one at a time */
        unsigned cur = (unsigned)((size_t)(tab[i] - tables) / TABLE_BYTES);
        while (o[i] < out + start[i + 1]) {
            if (avail[i] < MAXBITS)
                REFILL(i);
            uint16_t e = single[(size_t)cur * TABSIZE + (buf[i] & (TABSIZE - 1))];
            if (!(e >> 8)) {
                rc = E_DATA;
                goto done;
            }
            *o[i]++ = (uint8_t)e;
            buf[i] >>= e >> 8;
            avail[i] -= e >> 8;
            cur = (unsigned)table_of[(e & 255) >> shift];
            if (CONSUMED(i) > limit[i]) {
                rc = E_DATA;
                goto done;
            }
        }
        if ((CONSUMED(i) + 7) / 8 * 8 != limit[i]) {
            rc = E_DATA;
            goto done;
        }
    }
#undef REFILL
#undef CONSUMED
done:
    scratch_done(mem, owned);
    return rc;
}

#undef Entry
#undef SymsU
#undef TABLE_BYTES

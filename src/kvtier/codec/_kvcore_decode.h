/* The kv codec's order-1 Huffman decoder, included by _kvcore.c once per variant: MULTI (the
 * most symbols one table look-up decodes: eight suits sections of few bits per symbol, four
 * keeps the tables of sections with more bits per symbol small), WINDOW (the section's longest
 * code, so the tables' width) and PACKED (one 8-byte word an entry: the smallest tables).
 * VARIANT(name) names this copy's types and functions. */
/* A multi-symbol table entry: up to MULTI symbols, the table of the context after them, how
 * many symbols (0 where no code starts with these bits: the stream stops moving and the caller
 * notices) and the bits they take. A single-symbol entry: symbol (bits 0-7), length (8-15; 0:
 * no code). */
#define WSIZE (1u << WINDOW)
#define WREFILL (56 / WINDOW) /* look-ups per refill of a reader: it holds 56 bits or more */
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
#if PACKED
/* one 8-byte word an entry: bits (0-5), count (6-8), the next table's byte offset (the
 * table's index, 9 bits, times the table's 8 << WINDOW bytes) and the symbols (32-63) */
#define ENTRY_BYTES 8
#define OFFSET_MASK ((uint64_t)511 << (WINDOW + 3))
#if MULTI != 4 || WINDOW + 12 > 32
#error "a packed entry holds four symbols, and the offset must fit below them"
#endif
#else
#define ENTRY_BYTES (8 + sizeof(VARIANT(Syms)))
#endif
#define SymsU VARIANT(SymsU)

/* ``rounds`` rounds of WREFILL look-ups in each of the LANES readers (the inner loop: a
 * reader is a bit buffer with a marker bit above its bits, a pointer into its stream, the
 * control words of its context and its output). */
static inline __attribute__((always_inline)) void
VARIANT(rounds_body)(const char *base, size_t rounds, const uint8_t **s_rp, uint64_t *s_buf,
                     const char **s_nxt, uint8_t **s_o)
{
    const uint8_t *rp[LANES];
    uint64_t b[LANES];
    const char *nx[LANES];
    uint8_t *o[LANES];
    for (int j = 0; j < LANES; j++)
        rp[j] = s_rp[j], b[j] = s_buf[j], nx[j] = s_nxt[j], o[j] = s_o[j];
    for (size_t k = 0; k < rounds; k++) {
        for (int j = 0; j < LANES; j++) { /* refill to 56-63 bits, the marker above them */
            unsigned held = HELD(b[j]);
            uint64_t v = (b[j] ^ (uint64_t)1 << held) | *(const u64u *)rp[j] << held;
            rp[j] += (63 - held) >> 3;
            held |= 56;
            b[j] = (v & (((uint64_t)1 << held) - 1)) | (uint64_t)1 << held;
        }
#if PACKED
        for (int r = 0; r < WREFILL; r++)
            for (int j = 0; j < LANES; j++) {
                size_t x = (size_t)(b[j] & (WSIZE - 1));
                uint64_t c = *(const uint64_t *)(nx[j] + 8 * x);
                *(SymsU *)o[j] = (uint32_t)(c >> 32);
                o[j] += (c >> 6) & 7;
                b[j] >>= c & 63;
                nx[j] = base + (c & OFFSET_MASK);
            }
#else
        for (int r = 0; r < WREFILL; r++)
            for (int j = 0; j < LANES; j++) {
                size_t x = (size_t)(b[j] & (WSIZE - 1));
                uint64_t c = *(const uint64_t *)(nx[j] + 8 * x);
                *(SymsU *)o[j] =
                    *(const SymsU *)(nx[j] + 8 * (size_t)WSIZE + sizeof(VARIANT(Syms)) * x);
                o[j] += (c >> 8) & 0xff;
                b[j] >>= c & 63;
                nx[j] = (const char *)(uintptr_t)(c >> 16);
            }
#endif
    }
    for (int j = 0; j < LANES; j++)
        s_rp[j] = rp[j], s_buf[j] = b[j], s_nxt[j] = nx[j], s_o[j] = o[j];
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("bmi,bmi2"))) static void
VARIANT(rounds_bmi2)(const char *base, size_t rounds, const uint8_t **s_rp, uint64_t *s_buf,
                     const char **s_nxt, uint8_t **s_o)
{
    VARIANT(rounds_body)(base, rounds, s_rp, s_buf, s_nxt, s_o);
}
#endif

static void
VARIANT(rounds)(const char *base, size_t rounds, const uint8_t **s_rp, uint64_t *s_buf,
                const char **s_nxt, uint8_t **s_o)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("bmi2")) {
        VARIANT(rounds_bmi2)(base, rounds, s_rp, s_buf, s_nxt, s_o);
        return;
    }
#endif
    VARIANT(rounds_body)(base, rounds, s_rp, s_buf, s_nxt, s_o);
}

/* Decode streams [job->lo, job->hi) of a section whose tables decode_o1 built (see
 * StreamJob); 0 or an error code. Streams share nothing but the tables, which they only read,
 * so two jobs of one section run at once. */
static int
VARIANT(streams)(const StreamJob *job)
{
    const char *fast = job->fast;
    const size_t stride = job->stride;
    const uint16_t *single = job->single;
    const int *table_of = job->table_of;
    const unsigned shift = job->shift;
    uint8_t *out = job->out;
    const size_t *start = job->start;
    const uint8_t *const *base = job->base;
    const uint64_t *limit = job->limit;
    const int lo = job->lo, hi = job->hi;
    /* each stream's bit reader: the next bits in buf, below a marker bit (so the bits held
     * are the marker's position), refilled from rp; nxt: its context's control words */
    const uint8_t *rp[NSTREAMS];
    uint64_t buf[NSTREAMS];
    const char *nxt[NSTREAMS];
    uint8_t *o[NSTREAMS];
    for (int i = lo; i < hi; i++) {
        rp[i] = base[i];
        buf[i] = 1;
        nxt[i] = fast + (size_t)table_of[START] * stride;
        o[i] = out + start[i];
    }
    /* LANES slots decode together; a stream leaves its slot when it has no room left for a
     * round of look-ups and the next stream takes it, or an idle lane that decodes zeros
     * into a sink (so the slots stay in lockstep however the streams' sizes differ). */
    static const uint8_t zeros[8 * CHECK_EVERY + 8];
    uint8_t sink[MULTI * WREFILL * CHECK_EVERY + 8];
    const uint8_t *s_rp[LANES];
    uint64_t s_buf[LANES];
    const char *s_nxt[LANES];
    uint8_t *s_o[LANES], *s_end[LANES];
    int s_id[LANES], next = lo;
    for (int j = 0; j < LANES; j++)
        s_id[j] = -1;
    for (;;) {
        int active = 0;
        for (int j = 0; j < LANES; j++) { /* retire streams short of a round, fill slots */
            if (s_id[j] >= 0 && (size_t)(s_end[j] - s_o[j]) < MULTI * WREFILL) {
                int i = s_id[j];
                rp[i] = s_rp[j], buf[i] = s_buf[j], nxt[i] = s_nxt[j], o[i] = s_o[j];
                s_id[j] = -1;
            }
            while (s_id[j] < 0 && next < hi) {
                int i = next++;
                if ((size_t)(out + start[i + 1] - o[i]) < MULTI * WREFILL)
                    continue;
                s_rp[j] = rp[i], s_buf[j] = buf[i], s_nxt[j] = nxt[i];
                s_o[j] = o[i], s_end[j] = out + start[i + 1];
                s_id[j] = i;
            }
            active += s_id[j] >= 0;
        }
        if (!active)
            break;
        size_t room = SIZE_MAX;
        for (int j = 0; j < LANES; j++) {
            if (s_id[j] < 0) {
                s_rp[j] = zeros, s_buf[j] = 1, s_nxt[j] = fast, s_o[j] = sink;
                continue;
            }
            size_t r = (size_t)(s_end[j] - s_o[j]);
            room = r < room ? r : room;
        }
        size_t rounds = room / (MULTI * WREFILL);
        rounds = rounds < CHECK_EVERY ? rounds : CHECK_EVERY;
        uint8_t *before[LANES];
        for (int j = 0; j < LANES; j++)
            before[j] = s_o[j];
        VARIANT(rounds)(fast, rounds, s_rp, s_buf, s_nxt, s_o);
        /* a stream on a pattern no code starts with stops moving: it shows as a lane that
         * decoded fewer symbols than look-ups, here or in a later round */
        unsigned bad = 0;
        for (int j = 0; j < LANES; j++) {
            if (s_id[j] < 0)
                continue;
            int i = s_id[j];
            bad |= ((uint64_t)(s_rp[j] - base[i]) * 8 - HELD(s_buf[j]) > limit[i]) |
                   ((size_t)(s_o[j] - before[j]) < rounds * WREFILL);
        }
        if (bad)
            return E_DATA;
    }
    unsigned avail[NSTREAMS];
    for (int i = lo; i < hi; i++) { /* the tail's readers count their bits */
        avail[i] = HELD(buf[i]);
        buf[i] ^= (uint64_t)1 << avail[i];
    }
#define CONSUMED(i) ((uint64_t)(rp[i] - base[i]) * 8 - avail[i])
#define REFILL(i)                                                                             \
    do {                                                                                      \
        buf[i] |= *(const u64u *)rp[i] << avail[i];                                           \
        rp[i] += (63 - avail[i]) >> 3;                                                        \
        avail[i] |= 56;                                                                       \
    } while (0)
    for (int i = lo; i < hi; i++) { /* each stream's last symbols, one at a time */
        unsigned cur = (unsigned)((size_t)(nxt[i] - fast) / stride);
        while (o[i] < out + start[i + 1]) {
            if (avail[i] < WINDOW)
                REFILL(i);
            uint16_t e = single[(size_t)cur * WSIZE + (buf[i] & (WSIZE - 1))];
            if (!(e >> 8))
                return E_DATA;
            *o[i]++ = (uint8_t)e;
            buf[i] >>= e >> 8;
            avail[i] -= e >> 8;
            cur = (unsigned)table_of[(e & 255) >> shift];
            if (CONSUMED(i) > limit[i])
                return E_DATA;
        }
        if ((CONSUMED(i) + 7) / 8 * 8 != limit[i])
            return E_DATA;
    }
#undef REFILL
#undef CONSUMED
    return OK;
}

/* Decode the section (``len`` bytes followed by PAD readable zero bytes) into n symbols, its
 * streams on ``threads`` threads (1 or 2). */
static int
VARIANT(decode_o1)(const uint8_t *sec, size_t len, uint8_t *out, size_t n, int threads)
{
    if (len < HEAD_BYTES)
        return E_SHORT;
    if (sec[0] != VERSION || sec[1] != WINDOW || sec[2] != NSTREAMS || sec[3] > 7)
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
    /* multi: the look-up tables; narrow: the same for every narrower window of w < WINDOW
     * bits (ntab << w entries each); single: one symbol per look-up; lens_of: code lengths */
    size_t nt = (size_t)ntab, sz_multi = nt * WSIZE * sizeof(Entry),
           sz_narrow = nt * (WSIZE - 1) * sizeof(Entry), sz_single = nt * WSIZE * 2;
    int owned;
    size_t sz_fast = nt * (size_t)WSIZE * ENTRY_BYTES + 64;
    char *mem = scratch_get(SCRATCH_TABLES, sz_multi + sz_narrow + sz_single + nt * 256 + sz_fast,
                            &owned);
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
        if (!canonical_codes(lens, codes, WINDOW)) {
            rc = E_TABLE;
            goto done;
        }
        uint16_t *tab = single + (size_t)t * WSIZE;
        for (int s = 0; s < 256; s++)
            for (unsigned j = codes[s]; lens[s] && j < WSIZE; j += 1u << lens[s])
                tab[j] = (uint16_t)(s | lens[s] << 8);
    }
    /* Window by window, narrowest first: the entry of pattern y in a w-bit window is its
     * first symbol (when its code fits) followed by the entry of the rest of the bits in the
     * narrower window after it, cut to MULTI symbols. */
    Entry *win[WINDOW + 1];
    for (int w = 0, at = 0; w < WINDOW; at += 1 << w, w++)
        win[w] = narrow + (size_t)ntab * (size_t)at;
    win[WINDOW] = multi;
    for (int w = 0; w <= WINDOW; w++) {
        for (int t = 0; t < ntab; t++) {
            Entry *row = win[w] + ((size_t)t << w);
            for (unsigned y = 0; y < 1u << w; y++) {
                uint16_t e = single[(size_t)t * WSIZE + y];
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
    /* The look-up tables the main loop reads, one load a look-up. Packed: one word an entry
     * (see ENTRY_BYTES). Otherwise, per table, WSIZE control words and then WSIZE symbol
     * words; a control word holds the bits the entry consumes (byte 0: a shift by the whole
     * word shifts by them), its symbol count (byte 1) and the address of the next context's
     * control words (bits 16-63). */
    const size_t stride = (size_t)WSIZE * ENTRY_BYTES;
    char *fast = mem + sz_multi + sz_narrow + sz_single + nt * 256;
    fast += (64 - (uintptr_t)fast % 64) % 64;
#if PACKED
    for (int t = 0; t < ntab; t++) {
        uint64_t *word = (uint64_t *)(fast + (size_t)t * stride);
        for (unsigned y = 0; y < WSIZE; y++) {
            const Entry *d = multi + (size_t)t * WSIZE + y;
            word[y] = (uint64_t)d->bits | (uint64_t)d->count << 6 |
                      ((uint64_t)d->next * stride & OFFSET_MASK) | (uint64_t)d->syms << 32;
        }
    }
#else
    if (((uintptr_t)fast + nt * stride) >> 48) {
        rc = E_MEMORY; /* addresses must fit the control word's 48 bits */
        goto done;
    }
    for (int t = 0; t < ntab; t++) {
        uint64_t *ctrl = (uint64_t *)(fast + (size_t)t * stride);
        VARIANT(Syms) *syms = (VARIANT(Syms) *)(ctrl + WSIZE);
        for (unsigned y = 0; y < WSIZE; y++) {
            const Entry *d = multi + (size_t)t * WSIZE + y;
            ctrl[y] = (uint64_t)d->bits | (uint64_t)d->count << 8 |
                      (uint64_t)(uintptr_t)(fast + (size_t)d->next * stride) << 16;
            syms[y] = d->syms;
        }
    }
#endif
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
    StreamJob job = {VARIANT(streams), fast, stride, single, table_of, shift, out, start,
                     base, limit, 0, NSTREAMS, OK};
    rc = run_streams(&job, threads);
done:
    scratch_done(mem, owned);
    return rc;
}

#undef Entry
#undef ENTRY_BYTES
#undef OFFSET_MASK
#undef SymsU
#undef WSIZE
#undef WREFILL

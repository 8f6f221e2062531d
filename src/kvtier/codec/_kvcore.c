/* The kv codec's inner loops in C: byte-plane split/merge and an order-1 Huffman coder.
 *
 * split(raw, high, low, tokens, channels, threads=1)   raw -> the two planes (high
 *                                            channel-major)
 * merge(high, low, out, tokens, channels, threads=1)   the inverse, written straight into out
 * o1_encode(plane, shift, maxbits=MAXBITS, threads=1) -> bytes | None   the high plane as an
 *                                            order-1 Huffman section, codes of MAXBITS or NARROW
 *                                            bits
 * o1_encode_into(plane, shift, maxbits, out, threads=1) -> int   the same, written into out
 *                                            (0: no room)
 * o1_decode(section, out, threads=1)         the inverse; ValueError for a bad section
 * decode_planes(high, coded, low, out, tokens, channels, threads=1)   o1_decode, then merge
 * high_entropy(raw, count) -> float         collision entropy of the first high bytes
 *
 * ``threads`` 2: the call splits its passes over a thread it starts for them (the streams are
 * independent by design, and so are a merge's groups); the result is the same.
 *
 * Why C: numpy's strided transposes and zstd's match decoding are where a kv block's decode
 * spent its time; here a block is split and merged in one pass of 16-bit words, and the high
 * plane (sign + exponent, whose value depends on the previous one of the same channel) is
 * coded with one Huffman table per previous symbol, which codes tighter than zstd and decodes
 * several symbols per table look-up. Every call releases the GIL while it works.
 *
 * Section layout (little-endian): version (1), the longest code length (MAXBITS or NARROW:
 * the decoder's look-up tables are that many bits wide), NSTREAMS, the context shift (a
 * symbol's context is the one before it shifted right by this), the symbol count (u64), a
 * 33-byte bitmap of the contexts that have their own table (bit c < 256: previous symbol c;
 * bit 256: a stream's first symbol), then the tables - the fallback (for every other context)
 * first, then one per set bit in order - each a 32-byte bitmap of the symbols it codes and
 * their code lengths (4 bits each, two per byte, padded to a byte), then NSTREAMS stream
 * lengths (u32) and the streams. Stream i codes symbols [i*n/NSTREAMS, (i+1)*n/NSTREAMS) of
 * the n-symbol plane, so the streams decode independently and interleaved. Codes are
 * canonical, read LSB first.
 *
 * The decoder checks every length before it uses it, never writes past ``out``, never reads
 * past its own zero-padded copy of the section, and refuses a stream that does not end
 * exactly where its length says.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXBITS 11 /* the longest code a section may have */
#define NARROW 9   /* the other longest code the decoder knows: smaller, cache-resident tables */
#define NSTREAMS 8
#define NCTX 257
#define START 256
#define VERSION 1
#define HEAD_BYTES (12 + 33) /* version .. shift, symbol count (u64), context bitmap */
#define MIN_CTX_COUNT 4096 /* a context seen fewer times shares the fallback table */
#define ENC_LANES 4 /* streams the encoder writes in turn (NSTREAMS is a multiple) */
_Static_assert(ENC_LANES == 4 && NSTREAMS % ENC_LANES == 0, "encode_common's LANES4: 4 lanes");
#define CHECK_EVERY 16    /* rounds of look-ups between overrun checks */
#define PAD 1024          /* zero bytes after the copy: > 8 * CHECK_EVERY + 8 */
#ifndef LANES
#define LANES 4 /* streams decoded together (NSTREAMS is a multiple) */
#endif

/* the bits a marker-bit reader holds: the marker's position (its buffer is never 0) */
#define HELD(b) (63u ^ (unsigned)__builtin_clzll(b))

/* unaligned, typed (so they do not alias the decoder's state) */
typedef uint32_t u32u __attribute__((aligned(1)));
typedef uint64_t u64u __attribute__((aligned(1)));

/* --- scratch memory ------------------------------------------------------------------------ */

/* Each thread keeps its scratch buffers between calls (freed when it exits): fresh large
 * allocations are fresh pages, and their page faults would cost as much as a small block's
 * decode. A request larger than SCRATCH_KEEP is allocated and freed by the call. */
enum {
    SCRATCH_PLANE,
    SCRATCH_SECTION,
    SCRATCH_TABLES,
    SCRATCH_ENCODE,
    SCRATCH_STREAMS,
    SCRATCH_OUT,
    SCRATCHES
};
#define SCRATCH_KEEP ((size_t)64 << 20)

typedef struct {
    void *p;
    size_t cap;
} Scratch;

static pthread_key_t scratch_key;
static int scratch_ready;

static void
scratch_release(void *v)
{
    Scratch *s = v;
    for (int i = 0; i < SCRATCHES; i++)
        free(s[i].p);
    free(s);
}

/* ``size`` bytes for ``slot``; *owned says the caller frees them (scratch_done). */
static void *
scratch_get(int slot, size_t size, int *owned)
{
    Scratch *s = scratch_ready ? pthread_getspecific(scratch_key) : NULL;
    if (!s && scratch_ready && (s = calloc(SCRATCHES, sizeof *s)) != NULL &&
        pthread_setspecific(scratch_key, s) != 0) {
        free(s);
        s = NULL;
    }
    size = size ? size : 1;
    *owned = !s || size > SCRATCH_KEEP;
    if (*owned)
        return malloc(size);
    if (s[slot].cap < size) {
        void *p = realloc(s[slot].p, size);
        if (!p)
            return NULL;
        s[slot].p = p;
        s[slot].cap = size;
    }
    return s[slot].p;
}

static void
scratch_done(void *p, int owned)
{
    if (owned)
        free(p);
}

/* --- planes -------------------------------------------------------------------------------- */

#if defined(__SSE2__)
#include <emmintrin.h>
/* The body of a 16x16 byte transpose, v[i][j] = r[j][i] (four rounds of unpacks), on vectors
 * of type T with the intrinsics of prefix P: _mm, one matrix; _mm256, one per 128-bit lane. */
#define TRANSPOSE16_BODY(T, P)                                                             \
    {                                                                                      \
        T a[16], b[4][4], c[2][8];                                                         \
        for (int p = 0; p < 8; p++) {                                                      \
            a[2 * p] = P##_unpacklo_epi8(r[2 * p], r[2 * p + 1]);                          \
            a[2 * p + 1] = P##_unpackhi_epi8(r[2 * p], r[2 * p + 1]);                      \
        }                                                                                  \
        for (int q = 0; q < 4; q++) {                                                      \
            b[q][0] = P##_unpacklo_epi16(a[4 * q], a[4 * q + 2]);                          \
            b[q][1] = P##_unpackhi_epi16(a[4 * q], a[4 * q + 2]);                          \
            b[q][2] = P##_unpacklo_epi16(a[4 * q + 1], a[4 * q + 3]);                      \
            b[q][3] = P##_unpackhi_epi16(a[4 * q + 1], a[4 * q + 3]);                      \
        }                                                                                  \
        for (int h = 0; h < 2; h++)                                                        \
            for (int u = 0; u < 4; u++) {                                                  \
                c[h][2 * u] = P##_unpacklo_epi32(b[2 * h][u], b[2 * h + 1][u]);            \
                c[h][2 * u + 1] = P##_unpackhi_epi32(b[2 * h][u], b[2 * h + 1][u]);        \
            }                                                                              \
        for (int m = 0; m < 8; m++) {                                                      \
            v[2 * m] = P##_unpacklo_epi64(c[0][m], c[1][m]);                               \
            v[2 * m + 1] = P##_unpackhi_epi64(c[0][m], c[1][m]);                           \
        }                                                                                  \
    }

/* v[i][j] = r[j][i] for a 16x16 byte matrix. */
static inline void
transpose16(const __m128i *r, __m128i *v)
TRANSPOSE16_BODY(__m128i, _mm)
#define SIMD_PLANES 1
#else
#define SIMD_PLANES 0
#endif

/* One tokens x channels group: raw words -> low (token-major) and high (channel-major). */
static void
split_group(const uint8_t *raw, uint8_t *restrict high, uint8_t *restrict low, size_t tokens,
            size_t channels)
{
#if SIMD_PLANES
    if (tokens % 16 == 0 && channels % 16 == 0) {
        const __m128i mask = _mm_set1_epi16(0xff);
        for (size_t t0 = 0; t0 < tokens; t0 += 16)
            for (size_t c0 = 0; c0 < channels; c0 += 16) {
                __m128i h[16], v[16];
                for (int i = 0; i < 16; i++) {
                    const uint8_t *src = raw + 2 * ((t0 + i) * channels + c0);
                    __m128i w0 = _mm_loadu_si128((const __m128i *)src);
                    __m128i w1 = _mm_loadu_si128((const __m128i *)(src + 16));
                    _mm_storeu_si128((__m128i *)(low + (t0 + i) * channels + c0),
                                     _mm_packus_epi16(_mm_and_si128(w0, mask),
                                                      _mm_and_si128(w1, mask)));
                    h[i] = _mm_packus_epi16(_mm_srli_epi16(w0, 8), _mm_srli_epi16(w1, 8));
                }
                transpose16(h, v);
                for (int j = 0; j < 16; j++)
                    _mm_storeu_si128((__m128i *)(high + (c0 + j) * tokens + t0), v[j]);
            }
        return;
    }
#endif
    for (size_t t = 0; t < tokens; t++)
        for (size_t c = 0; c < channels; c++) {
            low[t * channels + c] = raw[2 * (t * channels + c)];
            high[c * tokens + t] = raw[2 * (t * channels + c) + 1];
        }
}

/* The most channels merge_group transposes for a strip of tokens at once. */
#define MERGE_ROW 1024
/* Outputs from this size on are written with streaming stores: they outgrow the caches
 * anyway, and a store that skips reading the line first halves the memory traffic. */
#define STREAM_MIN ((size_t)1 << 20)

#if SIMD_PLANES && defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define AVX2_PLANES 1
/* transpose16 on both 128-bit lanes at once: two 16x16 byte matrices. */
__attribute__((target("avx2"))) static inline void
transpose16x2(const __m256i *r, __m256i *v)
TRANSPOSE16_BODY(__m256i, _mm256)

/* merge_group's path on 32 channels a step (channels a multiple of 32); ``stream``: streaming
 * stores (``out`` 32-aligned). */
__attribute__((target("avx2"))) static void
merge_group_avx2(const uint8_t *high, const uint8_t *low, uint8_t *restrict out, size_t tokens,
                 size_t channels, int stream)
{
    __m256i rows[MERGE_ROW / 2]; /* [32-channel block][token]: lane k holds channels +16k */
    for (size_t t0 = 0; t0 < tokens; t0 += 16)
        for (size_t cb = 0; cb < channels; cb += MERGE_ROW) {
            size_t ce = cb + MERGE_ROW < channels ? cb + MERGE_ROW : channels;
            for (size_t c0 = cb; c0 < ce; c0 += 32) {
                __m256i h[16];
                for (int j = 0; j < 16; j++)
                    h[j] = _mm256_loadu2_m128i(
                        (const __m128i *)(high + (c0 + 16 + j) * tokens + t0),
                        (const __m128i *)(high + (c0 + j) * tokens + t0));
                transpose16x2(h, rows + (c0 - cb) / 2);
            }
            for (int i = 0; i < 16; i++) {
                const uint8_t *lo = low + (t0 + i) * channels;
                uint8_t *dst = out + 2 * (t0 + i) * channels;
                for (size_t c0 = cb; c0 < ce; c0 += 32) {
                    __m256i l = _mm256_loadu_si256((const __m256i *)(lo + c0));
                    __m256i v = rows[(c0 - cb) / 2 + (size_t)i];
                    __m256i a = _mm256_unpacklo_epi8(l, v), b = _mm256_unpackhi_epi8(l, v);
                    __m256i first = _mm256_permute2x128_si256(a, b, 0x20);
                    __m256i second = _mm256_permute2x128_si256(a, b, 0x31);
                    if (stream) {
                        _mm256_stream_si256((__m256i *)(dst + 2 * c0), first);
                        _mm256_stream_si256((__m256i *)(dst + 2 * c0 + 32), second);
                    } else {
                        _mm256_storeu_si256((__m256i *)(dst + 2 * c0), first);
                        _mm256_storeu_si256((__m256i *)(dst + 2 * c0 + 32), second);
                    }
                }
            }
        }
}
#else
#define AVX2_PLANES 0
#endif

/* The inverse of split_group, 16 tokens at a time: their channels transposed first (up to
 * MERGE_ROW at once), then each token's row written in one run. ``stream``: write with
 * streaming stores (``out`` 16-aligned); ``avx2``: take merge_group_avx2 (32-aligned ``out``
 * when streaming, channels a multiple of 32). */
static void
merge_group(const uint8_t *high, const uint8_t *low, uint8_t *restrict out, size_t tokens,
            size_t channels, int stream, int avx2)
{
#if AVX2_PLANES
    if (avx2) {
        merge_group_avx2(high, low, out, tokens, channels, stream);
        return;
    }
#else
    (void)avx2;
#endif
#if SIMD_PLANES
    if (tokens % 16 == 0 && channels % 16 == 0) {
        __m128i rows[MERGE_ROW]; /* [channel block][token] */
        for (size_t t0 = 0; t0 < tokens; t0 += 16)
            for (size_t cb = 0; cb < channels; cb += MERGE_ROW) {
                size_t ce = cb + MERGE_ROW < channels ? cb + MERGE_ROW : channels;
                for (size_t c0 = cb; c0 < ce; c0 += 16) {
                    __m128i h[16];
                    for (int j = 0; j < 16; j++)
                        h[j] =
                            _mm_loadu_si128((const __m128i *)(high + (c0 + j) * tokens + t0));
                    transpose16(h, rows + (c0 - cb));
                }
                for (int i = 0; i < 16; i++) {
                    const uint8_t *lo = low + (t0 + i) * channels;
                    uint8_t *dst = out + 2 * (t0 + i) * channels;
                    for (size_t c0 = cb; c0 < ce; c0 += 16) {
                        __m128i l = _mm_loadu_si128((const __m128i *)(lo + c0));
                        __m128i v = rows[c0 - cb + (size_t)i];
                        __m128i a = _mm_unpacklo_epi8(l, v), b = _mm_unpackhi_epi8(l, v);
                        if (stream) {
                            _mm_stream_si128((__m128i *)(dst + 2 * c0), a);
                            _mm_stream_si128((__m128i *)(dst + 2 * c0 + 16), b);
                        } else {
                            _mm_storeu_si128((__m128i *)(dst + 2 * c0), a);
                            _mm_storeu_si128((__m128i *)(dst + 2 * c0 + 16), b);
                        }
                    }
                }
            }
        return;
    }
#endif
    for (size_t t = 0; t < tokens; t++)
        for (size_t c = 0; c < channels; c++) {
            out[2 * (t * channels + c)] = low[t * channels + c];
            out[2 * (t * channels + c) + 1] = high[c * tokens + t];
        }
}

static void
split_planes(const uint8_t *raw, uint8_t *restrict high, uint8_t *restrict low, size_t n,
             size_t tokens, size_t channels)
{
    size_t group = tokens * channels, g = n / group;
    for (size_t k = 0; k < g; k++)
        split_group(raw + 2 * k * group, high + k * group, low + k * group, tokens, channels);
    for (size_t i = g * group; i < n; i++) {
        low[i] = raw[2 * i];
        high[i] = raw[2 * i + 1];
    }
}

static void
merge_planes(const uint8_t *high, const uint8_t *low, uint8_t *restrict out, size_t n,
             size_t tokens, size_t channels)
{
    size_t group = tokens * channels, g = n / group;
    int stream = SIMD_PLANES && 2 * n >= STREAM_MIN && (uintptr_t)out % 16 == 0;
    int avx2 = 0; /* groups lie a multiple of 1 KiB apart: out's alignment is every group's */
#if AVX2_PLANES
    avx2 = tokens % 16 == 0 && channels % 32 == 0 && (!stream || (uintptr_t)out % 32 == 0) &&
           __builtin_cpu_supports("avx2");
#endif
    for (size_t k = 0; k < g; k++)
        merge_group(high + k * group, low + k * group, out + 2 * k * group, tokens, channels,
                    stream, avx2);
#if SIMD_PLANES
    if (stream)
        _mm_sfence(); /* the streamed stores are seen before whatever the caller does next */
#endif
    for (size_t i = g * group; i < n; i++) {
        out[2 * i] = low[i];
        out[2 * i + 1] = high[i];
    }
}

/* --- two threads --------------------------------------------------------------------------- */

typedef struct {
    void (*work)(void *);
    void *arg;
} Share;

static void *
share_thread(void *p)
{
    Share *share = p;
    share->work(share->arg);
    return NULL;
}

/* work(here) on this thread and work(there) on a thread of its own, both done on return; with
 * one thread (or where none starts) both run here, one after the other. */
static void
run_pair(void (*work)(void *), void *here, void *there, int threads)
{
    Share share = {work, there};
    pthread_t helper;
    int started = threads > 1 && pthread_create(&helper, NULL, share_thread, &share) == 0;
    work(here);
    if (started)
        pthread_join(helper, NULL);
    else
        work(there);
}

/* One share of a split (words into high and low) or a merge (high and low into words). */
typedef struct {
    int merge;
    uint8_t *words, *high, *low;
    size_t n, tokens, channels;
} PlanesJob;

static void
planes_job(void *arg)
{
    const PlanesJob *j = arg;
    if (j->merge)
        merge_planes(j->high, j->low, j->words, j->n, j->tokens, j->channels);
    else
        split_planes(j->words, j->high, j->low, j->n, j->tokens, j->channels);
}

/* split_planes or merge_planes of n words, the second half of the groups on a thread of its
 * own when ``threads`` > 1 (and there are two groups to share). */
static void
planes_on(int merge, uint8_t *words, uint8_t *high, uint8_t *low, size_t n, size_t tokens,
          size_t channels, int threads)
{
    size_t group = tokens * channels, h = threads > 1 ? n / group / 2 * group : 0;
    PlanesJob first = {merge, words, high, low, h ? h : n, tokens, channels};
    PlanesJob second = {merge, words + 2 * h, high + h, low + h, n - h, tokens, channels};
    if (h)
        run_pair(planes_job, &first, &second, threads);
    else
        planes_job(&first);
}

/* --- Huffman ------------------------------------------------------------------------------- */

static inline unsigned
load16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t
load32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void
store32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline unsigned
reverse_bits(unsigned code, unsigned len)
{
    unsigned r = 0;
    for (unsigned i = 0; i < len; i++) {
        r = (r << 1) | (code & 1);
        code >>= 1;
    }
    return r;
}

/* Huffman code lengths (at most ``maxbits``) of ``counts``; absent symbols get 0. */
static void
huffman_lengths(const uint32_t *counts, uint8_t *lens, unsigned maxbits)
{
    uint64_t freq[512], w[256];
    int parent[512], sym[256], depth[512];
    memset(lens, 0, 256);
    int k = 0;
    for (int s = 0; s < 256; s++)
        if (counts[s])
            sym[k++] = s;
    if (k == 0)
        return;
    if (k == 1) {
        lens[sym[0]] = 1;
        return;
    }
    for (int i = 0; i < k; i++)
        w[i] = counts[sym[i]];
    for (;;) {
        for (int i = 1; i < k; i++) { /* leaves by weight (insertion sort: k <= 256) */
            uint64_t wi = w[i];
            int si = sym[i], j = i - 1;
            while (j >= 0 && w[j] > wi) {
                w[j + 1] = w[j];
                sym[j + 1] = sym[j];
                j--;
            }
            w[j + 1] = wi;
            sym[j + 1] = si;
        }
        for (int i = 0; i < k; i++)
            freq[i] = w[i];
        int li = 0, ii = k;
        for (int nx = k; nx < 2 * k - 1; nx++) { /* the two-queue construction */
            int pick[2];
            for (int j = 0; j < 2; j++) {
                if (li < k && (ii >= nx || freq[li] <= freq[ii]))
                    pick[j] = li++;
                else
                    pick[j] = ii++;
            }
            freq[nx] = freq[pick[0]] + freq[pick[1]];
            parent[pick[0]] = parent[pick[1]] = nx;
        }
        depth[2 * k - 2] = 0;
        int maxd = 0;
        for (int j = 2 * k - 3; j >= 0; j--) {
            depth[j] = depth[parent[j]] + 1;
            if (j < k && depth[j] > maxd)
                maxd = depth[j];
        }
        if (maxd <= (int)maxbits) {
            for (int i = 0; i < k; i++)
                lens[sym[i]] = (uint8_t)depth[i];
            return;
        }
        for (int i = 0; i < k; i++) /* too deep: flatten the weights and build again */
            w[i] = (w[i] >> 1) | 1;
    }
}

/* Canonical codes (bit-reversed, to be read LSB first) of ``lens``; 0 when a length is over
 * ``maxbits`` or the lengths oversubscribe the code space. */
static int
canonical_codes(const uint8_t *lens, unsigned *codes, unsigned maxbits)
{
    unsigned count[MAXBITS + 1] = {0}, next[MAXBITS + 1];
    uint32_t kraft = 0;
    for (int s = 0; s < 256; s++) {
        if (lens[s] > maxbits)
            return 0;
        if (lens[s]) {
            count[lens[s]]++;
            kraft += (1u << maxbits) >> lens[s];
        }
    }
    if (kraft > 1u << maxbits)
        return 0;
    unsigned code = 0; /* DEFLATE's assignment (count[0] is 0) */
    for (unsigned l = 1; l <= maxbits; l++) {
        code = (code + count[l - 1]) << 1;
        next[l] = code;
    }
    for (int s = 0; s < 256; s++)
        codes[s] = lens[s] ? reverse_bits(next[lens[s]]++, lens[s]) : 0;
    return 1;
}

static void
stream_bounds(size_t n, size_t *start)
{
    for (int i = 0; i <= NSTREAMS; i++)
        start[i] = (size_t)((unsigned __int128)n * (unsigned)i / NSTREAMS);
}

/* Streams [lo, hi)'s symbols after their first, up to ``common``: the (previous, current) pair
 * read as one 16-bit word looks up its code (code << 4 | length) in ``pair``; ENC_LANES streams
 * in turn, each writer flushing its accumulator once per ``per`` codes. */
static void
encode_common(const uint8_t *plane, const size_t *start, size_t common, const uint16_t *pair,
              unsigned maxbits, uint64_t *acc, unsigned *bits, uint8_t **w, int lo, int hi)
{
    const unsigned per = (64 - 8) / maxbits; /* codes that fit beside 7 held bits */
    for (int g = lo; g < hi; g += ENC_LANES) {
        uint64_t a[ENC_LANES];
        unsigned b[ENC_LANES];
        uint8_t *out[ENC_LANES];
        const uint8_t *q[ENC_LANES];
        for (int j = 0; j < ENC_LANES; j++) {
            a[j] = acc[g + j];
            b[j] = bits[g + j];
            out[j] = w[g + j];
            q[j] = plane + start[g + j];
        }
        size_t p = 1;
#define ADD(j)                                                                                \
    do {                                                                                      \
        uint32_t e_ = pair[load16(q[j] + p - 1)];                                             \
        a[j] |= (uint64_t)(e_ >> 4) << b[j];                                                  \
        b[j] += e_ & 15;                                                                      \
    } while (0)
#define FLUSH(j)                                                                              \
    do {                                                                                      \
        memcpy(out[j], &a[j], 8);                                                             \
        out[j] += b[j] >> 3;                                                                  \
        a[j] >>= b[j] & ~7u;                                                                  \
        b[j] &= 7;                                                                            \
    } while (0)
#define LANES4(m) m(0); m(1); m(2); m(3)
        while (p + per <= common) {
            for (unsigned k = 0; k < per; k++, p++) {
                LANES4(ADD);
            }
            LANES4(FLUSH);
        }
        for (; p < common; p++) {
            LANES4(ADD);
            LANES4(FLUSH);
        }
#undef LANES4
#undef FLUSH
#undef ADD
        for (int j = 0; j < ENC_LANES; j++) {
            acc[g + j] = a[j];
            bits[g + j] = b[j];
            w[g + j] = out[j];
        }
    }
}

/* Count each (previous, current) pair of streams [lo, lo + K) up to ``common`` in ``pairs``,
 * the streams' symbols in turn (consecutive increments rarely hit the same counter). */
static inline __attribute__((always_inline)) void
count_pairs(const uint8_t *plane, const size_t *start, size_t common, uint32_t *pairs, int lo,
            const int K)
{
    for (size_t p = 1; p < common; p++)
        for (int i = lo; i < lo + K; i++)
            pairs[load16(plane + start[i] + p - 1)]++;
}

/* One share of an encode's two passes over the streams [lo, hi): counting into ``pairs``, then
 * coding with ``pair`` into the writers' state. */
typedef struct {
    const uint8_t *plane;
    const size_t *start;
    size_t common;
    uint32_t *pairs;
    const uint16_t *pair;
    unsigned maxbits;
    uint64_t *acc;
    unsigned *bits;
    uint8_t **w;
    int lo, hi;
} EncodeJob;

/* count_pairs over the job's streams, with the stream count a constant in each call (all the
 * streams, or half on two threads) so that its inner loop unrolls */
static void
count_job(void *arg)
{
    const EncodeJob *j = arg;
    if (j->hi - j->lo == NSTREAMS)
        count_pairs(j->plane, j->start, j->common, j->pairs, j->lo, NSTREAMS);
    else
        count_pairs(j->plane, j->start, j->common, j->pairs, j->lo, NSTREAMS / 2);
}

static void
code_job(void *arg)
{
    const EncodeJob *j = arg;
    encode_common(j->plane, j->start, j->common, j->pair, j->maxbits, j->acc, j->bits, j->w, j->lo,
                  j->hi);
}

/* Encode ``plane`` into ``dst`` (capacity ``cap``) with codes of at most ``maxbits`` bits, its
 * two passes over the symbols split between two threads when ``threads`` > 1; the section's
 * size, or 0 when it does not fit (the caller then stores the plane another way). */
static size_t
encode_o1(const uint8_t *plane, size_t n, unsigned shift, unsigned maxbits, uint8_t *dst,
          size_t cap, int threads)
{
    /* counts, lengths, codes (before them the pair counts, after them the pair codes) */
    size_t sizes[3] = {NCTX * 256 * sizeof(uint32_t), NCTX * 256, NCTX * 256 * sizeof(unsigned)};
    _Static_assert(NCTX * 256 * sizeof(unsigned) >= 65536 * sizeof(uint32_t),
                   "the codes' space holds the pair counts and the pair codes");
    size_t all = sizes[0] + sizes[1] + sizes[2] + (threads > 1 ? 65536 * sizeof(uint32_t) : 0);
    int owned;
    char *mem = scratch_get(SCRATCH_ENCODE, all, &owned);
    size_t result = 0, start[NSTREAMS + 1];
    stream_bounds(n, start);
    if (!mem)
        return 0;
    memset(mem, 0, all);
    uint32_t(*counts)[256] = (uint32_t(*)[256])mem;
    uint8_t(*lens)[256] = (uint8_t(*)[256])(mem + sizes[0]);
    unsigned(*codes)[256] = (unsigned(*)[256])(mem + sizes[0] + sizes[1]);
    /* the streams' symbols in turn: consecutive increments rarely hit the same counter */
    size_t common = start[NSTREAMS] - start[NSTREAMS - 1];
    for (int i = 0; i < NSTREAMS; i++) {
        size_t len = start[i + 1] - start[i];
        common = len < common ? len : common;
        if (len)
            counts[START][plane[start[i]]]++;
    }
    /* each (previous, current) pair read as one 16-bit word and counted in a flat table (in the
     * codes' space, not yet used; on two threads the second half of the streams in one after
     * the scratch's end), then folded into the contexts */
    uint32_t *pairs = (uint32_t *)(mem + sizes[0] + sizes[1]);
    uint32_t *pairs2 = (uint32_t *)(mem + sizes[0] + sizes[1] + sizes[2]);
    EncodeJob first = {plane, start, common, pairs, NULL, maxbits, NULL, NULL, NULL, 0, NSTREAMS};
    EncodeJob second = first;
    if (threads > 1) {
        first.hi = second.lo = NSTREAMS / 2;
        second.pairs = pairs2;
        run_pair(count_job, &first, &second, threads);
        for (size_t k = 0; k < 65536; k++)
            pairs[k] += pairs2[k];
    }
    else
        count_job(&first);
    for (unsigned prev = 0; prev < 256; prev++)
        for (unsigned s = 0; s < 256; s++)
            counts[prev >> shift][s] += pairs[s << 8 | prev];
    for (int i = 0; i < NSTREAMS; i++)
        for (size_t p = start[i] + (common ? common : 1); p < start[i + 1]; p++)
            counts[plane[p - 1] >> shift][plane[p]]++;
    int table_of[NCTX], ntab = 1;
    uint32_t fallback[256] = {0};
    uint8_t ctxmap[33] = {0};
    for (int c = 0; c < NCTX; c++) {
        uint64_t total = 0;
        for (int s = 0; s < 256; s++)
            total += counts[c][s];
        if (total >= MIN_CTX_COUNT) {
            table_of[c] = ntab++;
            ctxmap[c >> 3] |= (uint8_t)(1u << (c & 7));
        }
        else {
            table_of[c] = 0;
            for (int s = 0; s < 256; s++)
                fallback[s] += counts[c][s];
        }
    }
    /* by table: 0 the fallback, then contexts in order */
    huffman_lengths(fallback, lens[0], maxbits);
    for (int c = 0; c < NCTX; c++)
        if (table_of[c])
            huffman_lengths(counts[c], lens[table_of[c]], maxbits);
    for (int t = 0; t < ntab; t++)
        if (!canonical_codes(lens[t], codes[t], maxbits))
            goto done;
    if (cap < HEAD_BYTES + (size_t)ntab * (32 + 128) + 4 * NSTREAMS)
        goto done;
    uint8_t *o = dst;
    o[0] = VERSION;
    o[1] = (uint8_t)maxbits;
    o[2] = NSTREAMS;
    o[3] = (uint8_t)shift;
    store32(o + 4, (uint32_t)n);
    store32(o + 8, (uint32_t)((uint64_t)n >> 32));
    memcpy(o + 12, ctxmap, 33);
    o += HEAD_BYTES;
    for (int t = 0; t < ntab; t++) {
        uint8_t *bitmap = o;
        memset(bitmap, 0, 32);
        o += 32;
        int half = 0;
        for (int s = 0; s < 256; s++) {
            if (!lens[t][s])
                continue;
            bitmap[s >> 3] |= (uint8_t)(1u << (s & 7));
            if (!half)
                *o = lens[t][s];
            else
                *o++ |= (uint8_t)(lens[t][s] << 4);
            half ^= 1;
        }
        if (half)
            o++;
    }
    /* (code << 4 | length) by table and symbol, looked up through the context's table */
    uint32_t(*pack)[256] = (uint32_t(*)[256])counts; /* counts are no longer needed */
    for (int t = 0; t < ntab; t++)
        for (int s = 0; s < 256; s++)
            pack[t][s] = codes[t][s] << 4 | lens[t][s];
    const uint32_t *tab_of_ctx[NCTX];
    for (int c = 0; c < NCTX; c++)
        tab_of_ctx[c] = pack[table_of[c]];
    uint8_t *lengths = o, *end = dst + cap;
    o += 4 * NSTREAMS;
    /* each stream into its own worst-case region of the scratch (MAXBITS per symbol, plus
     * the writer's 8-byte stores), all streams in turn, then packed one after another */
    size_t region[NSTREAMS], total = 0;
    for (int i = 0; i < NSTREAMS; i++) {
        region[i] = (start[i + 1] - start[i]) * MAXBITS / 8 + 16;
        total += region[i];
    }
    int owned_w;
    uint8_t *scratch = scratch_get(SCRATCH_STREAMS, total, &owned_w);
    if (!scratch)
        goto done;
    uint8_t *w[NSTREAMS], *w0[NSTREAMS];
    uint64_t acc[NSTREAMS] = {0};
    unsigned bits[NSTREAMS] = {0};
    for (int i = 0; i < NSTREAMS; i++)
        w0[i] = w[i] = i ? w0[i - 1] + region[i - 1] : scratch;
    /* a symbol's code depends only on it and the one before it, so the only state carried
     * from symbol to symbol is each writer's */
#define PUT(i, e)                                                                             \
    do {                                                                                      \
        uint32_t e_ = (e);                                                                    \
        acc[i] |= (uint64_t)(e_ >> 4) << bits[i];                                             \
        bits[i] += e_ & 15;                                                                   \
        *(u64u *)w[i] = acc[i];                                                               \
        w[i] += bits[i] >> 3;                                                                 \
        acc[i] >>= bits[i] & ~7u;                                                             \
        bits[i] &= 7;                                                                         \
    } while (0)
    for (int i = 0; i < NSTREAMS; i++)
        if (start[i] < start[i + 1])
            PUT(i, tab_of_ctx[START][plane[start[i]]]);
    uint16_t *pair = (uint16_t *)(mem + sizes[0] + sizes[1]); /* the codes' space, now free */
    for (unsigned s = 0; s < 256; s++) /* written in order: one line after another */
        for (unsigned prev = 0; prev < 256; prev++)
            pair[s << 8 | prev] = (uint16_t)tab_of_ctx[prev >> shift][s];
    first.pair = second.pair = pair;
    first.acc = second.acc = acc;
    first.bits = second.bits = bits;
    first.w = second.w = w;
    if (threads > 1)
        run_pair(code_job, &first, &second, threads);
    else
        code_job(&first);
    for (int i = 0; i < NSTREAMS; i++)
        for (size_t p = start[i] + (common ? common : 1); p < start[i + 1]; p++)
            PUT(i, tab_of_ctx[plane[p - 1] >> shift][plane[p]]);
#undef PUT
    for (int i = 0; i < NSTREAMS; i++) {
        if (bits[i])
            *w[i]++ = (uint8_t)acc[i];
        size_t len = (size_t)(w[i] - w0[i]);
        if ((size_t)(end - o) < len) {
            scratch_done(scratch, owned_w);
            goto done;
        }
        memcpy(o, w0[i], len);
        store32(lengths + 4 * i, (uint32_t)len);
        o += len;
    }
    scratch_done(scratch, owned_w);
    result = (size_t)(o - dst);
done:
    scratch_done(mem, owned);
    return result;
}

/* Error codes of decode_o1; the Python wrapper turns them into ValueError messages. */
enum { OK = 0, E_SHORT, E_HEAD, E_TABLE, E_STREAMS, E_DATA, E_COUNT, E_MEMORY };
static const char *const ERRORS[] = {
    "",
    "section truncated",
    "section header is not valid",
    "a code table is not valid",
    "stream lengths do not match the section",
    "a stream does not decode to its length",
    "section holds another number of symbols",
    "out of memory"};

/* One share of a section's streams to decode: the tables and layout decode_o1 prepared, the
 * streams [lo, hi), and the code it ended with. */
typedef struct StreamJob {
    int (*decode)(const struct StreamJob *job); /* the variant's stream decoder */
    const char *fast;                           /* the look-up tables the main loop reads */
    size_t stride;                              /* bytes of one context's look-up table */
    const uint16_t *single;                     /* one symbol a look-up (the streams' tails) */
    const int *table_of;                        /* table of each context */
    unsigned shift;
    uint8_t *out;
    const size_t *start;           /* stream i's symbols are out[start[i] .. start[i + 1]) */
    const uint8_t *const *base;    /* each stream's first byte */
    const uint64_t *limit;         /* each stream's bits */
    int lo, hi;
    int rc;
} StreamJob;

static void
stream_job(void *arg)
{
    StreamJob *job = arg;
    job->rc = job->decode(job);
}

/* Decode every stream of ``job``: the second half on a thread of its own while this one
 * decodes the first when ``threads`` > 1. */
static int
run_streams(StreamJob *job, int threads)
{
    if (threads < 2)
        return job->decode(job);
    StreamJob other = *job;
    job->hi = other.lo = NSTREAMS / 2;
    run_pair(stream_job, job, &other, threads);
    return job->rc ? job->rc : other.rc;
}

#define PACKED 0
#define VARIANT(name) name##_m8
#define MULTI 8
#define WINDOW 11
#include "_kvcore_decode.h"
#undef WINDOW
#undef MULTI
#undef VARIANT
#define VARIANT(name) name##_m4
#define MULTI 4
#define WINDOW 11
#include "_kvcore_decode.h"
#undef WINDOW
#undef MULTI
#undef VARIANT
#undef PACKED
#define VARIANT(name) name##_n
#define MULTI 4
#define WINDOW NARROW
#define PACKED 1
#include "_kvcore_decode.h"
#undef PACKED
#undef WINDOW
#undef MULTI
#undef VARIANT

/* Decode the section (``len`` bytes followed by PAD readable zero bytes) into n symbols, with
 * the tables that suit its longest code and bits per symbol. */
static int
decode_o1(const uint8_t *sec, size_t len, uint8_t *out, size_t n, int threads)
{
    if (len >= 2 && sec[1] == NARROW)
        return decode_o1_n(sec, len, out, n, threads);
    return len > n / 2 ? decode_o1_m4(sec, len, out, n, threads)
                       : decode_o1_m8(sec, len, out, n, threads);
}

/* --- Python -------------------------------------------------------------------------------- */

static int
layout_ok(Py_ssize_t tokens, Py_ssize_t channels, const char *what)
{
    if (tokens < 1 || channels < 1 || tokens > (Py_ssize_t)UINT32_MAX ||
        channels > (Py_ssize_t)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: tokens and channels must be 1 to 2**32 - 1", what);
        return 0;
    }
    return 1;
}

/* split (raw -> high, low) or merge (high, low -> out): both take three buffers, a layout. */
static PyObject *
planes_call(PyObject *args, int merge)
{
    const char *what = merge ? "merge" : "split";
    Py_buffer a, b, c; /* split: raw, high, low; merge: high, low, out */
    Py_ssize_t tokens, channels;
    int threads = 1;
    if (!PyArg_ParseTuple(args, merge ? "y*y*w*nn|i" : "y*w*w*nn|i", &a, &b, &c, &tokens, &channels,
                          &threads))
        return NULL;
    PyObject *res = NULL;
    const Py_buffer *high = merge ? &a : &b, *low = merge ? &b : &c, *words = merge ? &c : &a;
    size_t n = (size_t)high->len;
    if (!layout_ok(tokens, channels, what))
        goto out;
    if (low->len != high->len || (size_t)words->len / 2 < n) {
        PyErr_Format(PyExc_ValueError, "%s: plane sizes do not match", what);
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS;
    planes_on(merge, words->buf, high->buf, low->buf, n, (size_t)tokens, (size_t)channels,
              threads);
    Py_END_ALLOW_THREADS;
    res = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&c);
    return res;
}

static PyObject *
py_split(PyObject *self, PyObject *args)
{
    return planes_call(args, 0);
}

static PyObject *
py_merge(PyObject *self, PyObject *args)
{
    return planes_call(args, 1);
}

/* Whether an encoder's arguments are valid; ValueError when not. */
static int
encode_args_ok(size_t n, int shift, int maxbits)
{
    if (shift >= 0 && shift <= 7 && (maxbits == MAXBITS || maxbits == NARROW) &&
        n / NSTREAMS * MAXBITS / 8 + 16 <= UINT32_MAX)
        return 1;
    PyErr_SetString(PyExc_ValueError,
                    "o1_encode: shift 0-7, maxbits MAXBITS or NARROW, a plane under 2**34");
    return 0;
}

/* encode_o1 of a plane with the GIL released: the section's size, 0 when it does not fit */
static size_t
encode_released(const Py_buffer *plane, int shift, int maxbits, uint8_t *dst, size_t cap,
                int threads)
{
    size_t got, n = (size_t)plane->len;
    Py_BEGIN_ALLOW_THREADS;
    got = n ? encode_o1(plane->buf, n, (unsigned)shift, (unsigned)maxbits, dst, cap, threads) : 0;
    Py_END_ALLOW_THREADS;
    return got;
}

static PyObject *
py_o1_encode(PyObject *self, PyObject *args)
{
    Py_buffer plane;
    int shift, maxbits = MAXBITS, threads = 1;
    if (!PyArg_ParseTuple(args, "y*i|ii", &plane, &shift, &maxbits, &threads))
        return NULL;
    PyObject *res = NULL;
    size_t n = (size_t)plane.len;
    if (!encode_args_ok(n, shift, maxbits))
        goto out;
    /* a section no smaller than the plane gains nothing: its capacity is the plane's size */
    int owned;
    uint8_t *buf = scratch_get(SCRATCH_OUT, n, &owned);
    if (!buf) {
        PyErr_NoMemory();
        goto out;
    }
    size_t got = encode_released(&plane, shift, maxbits, buf, n, threads);
    res = got ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)got) : Py_NewRef(Py_None);
    scratch_done(buf, owned);
out:
    PyBuffer_Release(&plane);
    return res;
}

static PyObject *
py_o1_encode_into(PyObject *self, PyObject *args)
{
    Py_buffer plane, out;
    int shift, maxbits, threads = 1;
    if (!PyArg_ParseTuple(args, "y*iiw*|i", &plane, &shift, &maxbits, &out, &threads))
        return NULL;
    PyObject *res = NULL;
    size_t n = (size_t)plane.len;
    if (!encode_args_ok(n, shift, maxbits))
        goto done;
    res = PyLong_FromSize_t(
        encode_released(&plane, shift, maxbits, out.buf, (size_t)out.len, threads));
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&plane);
    return res;
}

/* Decode a section into ``out`` (n bytes) without the GIL; 0 or an error code. */
static int
decode_section(const Py_buffer *sec, uint8_t *out, size_t n, int threads)
{
    size_t len = (size_t)sec->len;
    int owned;
    uint8_t *copy = scratch_get(SCRATCH_SECTION, len + PAD, &owned);
    if (!copy)
        return E_MEMORY;
    memcpy(copy, sec->buf, len);
    memset(copy + len, 0, PAD);
    int rc = decode_o1(copy, len, out, n, threads);
    scratch_done(copy, owned);
    return rc;
}

static PyObject *
raise_rc(int rc)
{
    if (rc == E_MEMORY)
        return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, ERRORS[rc]);
    return NULL;
}

static PyObject *
py_o1_decode(PyObject *self, PyObject *args)
{
    Py_buffer sec, out;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "y*w*|i", &sec, &out, &threads))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = decode_section(&sec, out.buf, (size_t)out.len, threads);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&sec);
    PyBuffer_Release(&out);
    return rc ? raise_rc(rc) : Py_NewRef(Py_None);
}

static PyObject *
py_decode_planes(PyObject *self, PyObject *args)
{
    Py_buffer high, low, out;
    int coded, threads = 1;
    Py_ssize_t tokens, channels;
    if (!PyArg_ParseTuple(args, "y*py*w*nn|i", &high, &coded, &low, &out, &tokens, &channels,
                          &threads))
        return NULL;
    PyObject *res = NULL;
    size_t n = (size_t)low.len;
    if (!layout_ok(tokens, channels, "decode_planes"))
        goto out;
    if ((size_t)out.len / 2 < n || (!coded && (size_t)high.len != n)) {
        PyErr_SetString(PyExc_ValueError, "decode_planes: plane sizes do not match");
        goto out;
    }
    int rc = OK;
    Py_BEGIN_ALLOW_THREADS;
    const uint8_t *hi = high.buf;
    uint8_t *plane = NULL;
    int owned = 0;
    if (coded) {
        plane = scratch_get(SCRATCH_PLANE, n, &owned);
        rc = plane ? decode_section(&high, plane, n, threads) : E_MEMORY;
        hi = plane;
    }
    if (rc == OK)
        planes_on(1, out.buf, (uint8_t *)hi /* only read */, low.buf, n, (size_t)tokens,
                  (size_t)channels, threads);
    if (plane)
        scratch_done(plane, owned);
    Py_END_ALLOW_THREADS;
    res = rc ? raise_rc(rc) : Py_NewRef(Py_None);
out:
    PyBuffer_Release(&high);
    PyBuffer_Release(&low);
    PyBuffer_Release(&out);
    return res;
}

/* Order-0 entropy, in bits a symbol, of the high bytes of the first ``count`` 16-bit words. */
static PyObject *
py_high_entropy(PyObject *self, PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &raw, &count))
        return NULL;
    if (count < 1 || count > raw.len / 2) {
        PyBuffer_Release(&raw);
        PyErr_SetString(PyExc_ValueError, "high_entropy: count must be 1 to len(raw) // 2");
        return NULL;
    }
    uint32_t hist[4][256] = {{0}};
    const uint8_t *p = raw.buf;
    Py_ssize_t i = 0;
    for (; i + 4 <= count; i += 4) { /* four histograms: repeats do not wait on each other */
        hist[0][p[2 * i + 1]]++;
        hist[1][p[2 * i + 3]]++;
        hist[2][p[2 * i + 5]]++;
        hist[3][p[2 * i + 7]]++;
    }
    for (; i < count; i++)
        hist[0][p[2 * i + 1]]++;
    PyBuffer_Release(&raw);
    /* Renyi order 2: -log2 of the chance two symbols are equal. One log instead of one a
     * symbol, and never above the order-0 (Shannon) entropy, so a block it calls random is. */
    double pairs = 0, total = (double)count;
    for (int s = 0; s < 256; s++) {
        double c = (double)hist[0][s] + hist[1][s] + hist[2][s] + hist[3][s];
        pairs += c * c;
    }
    return PyFloat_FromDouble(-log2(pairs / (total * total)));
}

static PyMethodDef methods[] = {
    {"split", py_split, METH_VARARGS,
     "split(raw, high, low, tokens, channels, threads=1): the two planes of raw's 16-bit "
     "words (threads=2: half the groups on a thread of their own)."},
    {"merge", py_merge, METH_VARARGS,
     "merge(high, low, out, tokens, channels, threads=1): the inverse of split, into out."},
    {"o1_encode", py_o1_encode, METH_VARARGS,
     "o1_encode(plane, shift, maxbits=MAXBITS, threads=1) -> bytes | None: the order-1 "
     "Huffman section (None: no gain); threads=2: half the streams on a thread of their own."},
    {"o1_encode_into", py_o1_encode_into, METH_VARARGS,
     "o1_encode_into(plane, shift, maxbits, out, threads=1) -> int: the section's size, "
     "written at the start of out; 0 when it does not fit in out."},
    {"o1_decode", py_o1_decode, METH_VARARGS,
     "o1_decode(section, out, threads=1): decode a section into out (its size is the symbol "
     "count); threads=2: half the streams on a thread of their own."},
    {"high_entropy", py_high_entropy, METH_VARARGS,
     "high_entropy(raw, count) -> float: collision (Renyi order-2) entropy, bits a symbol, of "
     "the high bytes of the first count 16-bit words: at most their order-0 entropy."},
    {"decode_planes", py_decode_planes, METH_VARARGS,
     "decode_planes(high, coded, low, out, tokens, channels, threads=1): decode the high "
     "section (when coded) and merge it with the low plane into out."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kvcore",
                                    "The kv codec's inner loops in C.", -1, methods};

PyMODINIT_FUNC
PyInit__kvcore(void)
{
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) {
        PyErr_SetString(PyExc_ImportError, "_kvcore needs a little-endian host");
        return NULL;
    }
    if (!scratch_ready)
        scratch_ready = pthread_key_create(&scratch_key, scratch_release) == 0;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "MAXBITS", MAXBITS) < 0 ||
              PyModule_AddIntConstant(m, "NARROW", NARROW) < 0 ||
              PyModule_AddIntConstant(m, "NSTREAMS", NSTREAMS) < 0 ||
              PyModule_AddIntConstant(m, "VERSION", VERSION) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

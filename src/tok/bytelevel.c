/* src/tok/bytelevel.c — GPT-2's byte <-> printable-character table (the ByteLevel
 * pre-tokenizer and decoder of tokenizers).
 *
 * Bytes that are printable in Latin-1 (0x21..0x7E, 0xA1..0xAC, 0xAE..0xFF) stand for
 * themselves; the other 68 bytes, in increasing order, get U+0100, U+0101, ... so that every
 * byte has a visible, non-space character. */
#include "tok/tok_internal.h"

static bool printable_latin1(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 shifted bytes are 0x00..0x20 (33), 0x7F..0xA0 (34) and 0xAD, in that order. */
uint32_t epyq_tok_bytelevel_char(uint8_t b) {
    if (printable_latin1(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int epyq_tok_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable_latin1(cp) ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + (k - 33));
    return k == 67 ? 0xAD : -1;
}

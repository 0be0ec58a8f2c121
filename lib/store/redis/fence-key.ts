/**
 * Where fencing tokens are counted: one small counter key per Redis Cluster hash slot, named so
 * that it lands in the same slot as the locks it counts for. A script that takes a lock can then
 * touch both keys on any node, and the number of counter keys stays bounded (16,384 at most)
 * however many distinct lock names come and go.
 */

/** Redis Cluster's number of hash slots. */
export const HASH_SLOTS = 16_384;

/** The marker in a counter key's name: `${keyPrefix}#fence:{tag}`. Lock names may not start with it. */
export const FENCE_MARKER = '#fence:';

const CRC16_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let byte = 0; byte < 256; byte += 1) {
    let crc = byte << 8;
    for (let bit = 0; bit < 8; bit += 1) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    table[byte] = crc;
  }
  return table;
})();

/** CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with. */
function crc16(bytes: Uint8Array, from: number, to: number): number {
  let crc = 0;
  for (let i = from; i < to; i += 1) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ bytes[i]) & 0xff];
  return crc;
}

/**
 * The hash slot of `key` as Redis Cluster computes it, `{hash tags}` included. The hashed text is
 * checksummed straight from the string while it is ASCII (a UTF-8 multi-byte character never holds
 * a "{" or "}" byte, so the tag is found the same way in the string as in its bytes), and encoded
 * first otherwise: every lock operation computes slots, most names are ASCII.
 */
export function keySlot(key: string): number {
  let from = 0;
  let to = key.length;
  const open = key.indexOf('{');
  if (open !== -1) {
    const close = key.indexOf('}', open + 1);
    if (close > open + 1) {
      from = open + 1;
      to = close;
    }
  }
  let crc = 0;
  for (let i = from; i < to; i += 1) {
    const code = key.charCodeAt(i);
    if (code > 0x7f) return utf8KeySlot(key);
    crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ code) & 0xff];
  }
  return crc % HASH_SLOTS;
}

/** `keySlot` over the UTF-8 bytes of `key`. */
function utf8KeySlot(key: string): number {
  const bytes = Buffer.from(key, 'utf8');
  const open = bytes.indexOf(0x7b); // '{'
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1); // '}'
    if (close > open + 1) return crc16(bytes, open + 1, close) % HASH_SLOTS;
  }
  return crc16(bytes, 0, bytes.length) % HASH_SLOTS;
}

/**
 * For each slot, the smallest number whose base-36 spelling hashes to it; built on first use
 * (about 170,000 checksums of 1 to 4 bytes, a few milliseconds) and never changed afterwards.
 * A constant of the algorithm, not state: every application in the process computes the same.
 */
let tagNumbers: Uint32Array | undefined;

function tagTable(): Uint32Array {
  if (tagNumbers) return tagNumbers;
  const table = new Uint32Array(HASH_SLOTS).fill(0xffffffff);
  let missing = HASH_SLOTS;
  for (let n = 0; missing > 0; n += 1) {
    const tag = Buffer.from(n.toString(36), 'latin1');
    const slot = crc16(tag, 0, tag.length) % HASH_SLOTS;
    if (table[slot] === 0xffffffff) {
      table[slot] = n;
      missing -= 1;
    }
  }
  tagNumbers = table;
  return table;
}

/** A short hash tag whose slot is `slot`. */
export function slotTag(slot: number): string {
  return tagTable()[slot].toString(36);
}

/** The fencing counter key that shares `lockKey`'s hash slot. */
export function fenceKeyFor(keyPrefix: string, lockKey: string): string {
  return `${keyPrefix}${FENCE_MARKER}{${slotTag(keySlot(lockKey))}}`;
}

/**
 * A key in `lockKey`'s slot that is never written: every script that changes a lock declares it on
 * a Cluster (see `RedisLockStore.lineScriptKeys`). While the slot migrates between two masters, its
 * keys may be split between them, and a script that changed one key and then reached one that had
 * moved would fail halfway (`Script attempted to access a non local key`). Redis refuses a command
 * that names a key missing from a migrating or importing slot with `TRYAGAIN` before it runs (or
 * `ASK`, and then `TRYAGAIN` on the importing side), and this key is always missing: so such a
 * script never runs while its slot is open, and either runs whole or changes nothing. Reads (check,
 * inspect) and renewals do not declare it: they keep working while the lock's keys are on one side.
 */
export function slotGuardFor(keyPrefix: string, lockKey: string): string {
  return `${keyPrefix}${FENCE_MARKER}{${slotTag(keySlot(lockKey))}}:absent`;
}

/** The marker in the names of a lock's line keys. Lock names may not start with it. */
export const LINE_MARKER = '#line:';

/**
 * The two keys of `lockKey`'s line of waiters (its order and its deadlines), in `slotKey`'s slot
 * (`slotKey` is the lock key as Redis sees it, with the client's own keyPrefix).
 */
export function lineKeysFor(keyPrefix: string, slotKey: string, lockKey: string): [string, string] {
  const tagged = `${keyPrefix}${LINE_MARKER}{${slotTag(keySlot(slotKey))}}`;
  return [`${tagged}q:${lockKey}`, `${tagged}t:${lockKey}`];
}

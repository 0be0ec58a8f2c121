import fc from 'fast-check';
import { HASH_SLOTS, keySlot } from './fence-key';

const CRC16_POLYNOMIAL = 0x1021;

/** Redis Cluster's slot of `key`, bit by bit from its UTF-8 bytes, as the Cluster specification writes it. */
function specSlot(key: string): number {
  let bytes = Buffer.from(key, 'utf8');
  const open = bytes.indexOf(0x7b);
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit += 1)
      crc = crc & 0x8000 ? ((crc << 1) ^ CRC16_POLYNOMIAL) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % HASH_SLOTS;
}

describe('keySlot: the hash slot Redis Cluster gives a key', () => {
  it.each<[string, number]>([
    // The Cluster specification's own examples, and slots a Cluster answers CLUSTER KEYSLOT with.
    ['123456789', 0x31c3 % HASH_SLOTS],
    ['foo', 12182],
    ['{user1000}.following', 3443],
    ['{user1000}.followers', 3443],
    ['foo{}{bar}', specSlot('foo{}{bar}')],
    ['foo{{bar}}zap', specSlot('{bar')],
    ['foo{bar}{zap}', specSlot('bar')],
    ['', 0],
  ])('%j is in slot %i', (key, slot) => {
    expect(keySlot(key)).toBe(slot);
  });

  it('hashes non-ASCII names by their UTF-8 bytes, inside and outside a hash tag', () => {
    for (const key of ['lock:é', 'ключ', '{tag}ключ', 'ключ{tag}', '{ключ}', 'a{é}b', '😀', '{😀}:x']) {
      expect(keySlot(key)).toBe(specSlot(key));
    }
  });

  it('agrees with the specification for any string', () => {
    const text = fc.string({ unit: fc.constantFrom('a', 'z', '{', '}', ':', 'é', 'я', '😀', '\u007f', '\u0080') });
    fc.assert(
      fc.property(fc.oneof(text, fc.string({ unit: 'binary' })), (key) => keySlot(key) === specSlot(key)),
      {
        numRuns: 500,
      },
    );
  });
});

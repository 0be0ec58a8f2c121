import { OwnerIds, SHARED_OWNER_PREFIX } from './owner-ids';

describe('OwnerIds', () => {
  it('hands out distinct ids of 32 hex digits (128 bits), across several pools', () => {
    const ids = new OwnerIds();
    const seen = new Set<string>();
    for (let i = 0; i < 1_000; i += 1) {
      const id = ids.next();
      expect(id).toMatch(/^[0-9a-f]{32}$/);
      seen.add(id);
    }
    expect(seen.size).toBe(1_000);
  });

  it("starts a shared hold's id with the shared prefix, followed by 32 hex digits", () => {
    const ids = new OwnerIds();
    for (let i = 0; i < 300; i += 1) expect(ids.next(true)).toMatch(new RegExp(`^${SHARED_OWNER_PREFIX}[0-9a-f]{32}$`));
  });

  it('draws every pool afresh: two generators share no id', () => {
    const a = new OwnerIds();
    const b = new OwnerIds();
    const fromA = new Set(Array.from({ length: 600 }, () => a.next()));
    for (let i = 0; i < 600; i += 1) expect(fromA.has(b.next())).toBe(false);
  });
});

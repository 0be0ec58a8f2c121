import { randomBytes } from 'node:crypto';

/**
 * The first character of a shared hold's owner id (a reader's, a permit's), which an exclusive
 * hold's id (hex) never has: a store can tell the kinds apart from the id alone (see
 * `LockStore.acquire`).
 */
export const SHARED_OWNER_PREFIX = 's';

/**
 * Random 128-bit owner ids, cut from a pool filled 256 ids at a time: one `randomBytes` call per
 * acquisition cost a tenth of the CPU of an uncontended lock/release cycle. A shared hold's id
 * starts with SHARED_OWNER_PREFIX.
 */
export class OwnerIds {
  private pool = Buffer.alloc(0);
  private offset = 0;

  next(shared = false): string {
    if (this.offset === this.pool.length) {
      this.pool = randomBytes(16 * 256);
      this.offset = 0;
    }
    const id = this.pool.toString('hex', this.offset, this.offset + 16);
    this.offset += 16;
    return shared ? SHARED_OWNER_PREFIX + id : id;
  }
}

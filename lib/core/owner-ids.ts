import { randomBytes } from 'node:crypto';

/**
 * The first character of a shared hold's owner id (a reader's, a permit's), which an exclusive
 * hold's id (hex) never has: a store can tell the kinds apart from the id alone (see
 * `LockStore.acquire`).
 */
export const SHARED_OWNER_PREFIX = 's';

/** Ids cut from one pool. */
const IDS_PER_POOL = 256;
/** Hex digits per id: 128 bits. */
const ID_DIGITS = 32;

/**
 * Random 128-bit owner ids (32 hex digits), cut from a pool filled 256 ids at a time and encoded
 * once: one `randomBytes` call per acquisition cost a tenth of the CPU of an uncontended
 * lock/release cycle, and encoding each id on its own a few percent more. A shared hold's id
 * starts with SHARED_OWNER_PREFIX.
 */
export class OwnerIds {
  private pool = '';
  private offset = 0;

  next(shared = false): string {
    if (this.offset === this.pool.length) {
      this.pool = randomBytes((ID_DIGITS / 2) * IDS_PER_POOL).toString('hex');
      this.offset = 0;
    }
    const id = this.pool.slice(this.offset, this.offset + ID_DIGITS);
    this.offset += ID_DIGITS;
    return shared ? SHARED_OWNER_PREFIX + id : id;
  }
}

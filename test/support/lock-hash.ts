/*
 * A lock's Redis hash holds two kinds of fields. Holder fields say who holds it: `<owner>` → '1' for an
 * exclusive hold, `<waiter>:<token>` → '0' for a grant not yet taken up, `<owner>` → '<lease end ms>' for
 * each shared hold (reader, semaphore permit). Description fields, `=<owner>` → '<since ms>|<token>|<json>',
 * describe a holder for inspection; waiting marks, `=~<owner>` → '1', say that someone waits behind an
 * exclusive hold. No holder field starts with `=` (owner ids are hex, or `s`+hex for shared holds; waiter
 * ids hex or `s`+hex), so tests that ask who holds a lock read `holdsOf`, and tests about descriptions
 * `descriptionsOf`.
 */
import type { Cluster, Redis } from 'ioredis';

type HashReader = Pick<Redis | Cluster, 'hgetall'>;

/** Whether a field of a lock hash describes a holder rather than being one. */
export function isDescriptionField(field: string): boolean {
  return field.startsWith('=');
}

/** The holder fields of a lock key's HGETALL reply read some other way (a pipeline, a worker, a script). */
export function holderFields(hash: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(hash).filter(([field]) => !isDescriptionField(field)));
}

/** HGETALL of the lock key, holder fields only (`{}` when the key does not exist). */
export async function holdsOf(redis: HashReader, key: string): Promise<Record<string, string>> {
  return holderFields(await redis.hgetall(key));
}

/** Whether a field of a lock hash is a waiting mark (someone waits behind the hold it names). */
export function isWaitingMark(field: string): boolean {
  return field.startsWith('=~');
}

/** The description fields of the lock key, keyed by owner (the field without its leading `=`). */
export async function descriptionsOf(redis: HashReader, key: string): Promise<Record<string, string>> {
  const hash = await redis.hgetall(key);
  return Object.fromEntries(
    Object.entries(hash)
      .filter(([field]) => isDescriptionField(field) && !isWaitingMark(field))
      .map(([field, value]) => [field.slice(1), value]),
  );
}

/** The holders of the lock key that carry a waiting mark. */
export async function waitingMarksOf(redis: HashReader, key: string): Promise<string[]> {
  const hash = await redis.hgetall(key);
  return Object.keys(hash)
    .filter(isWaitingMark)
    .map((field) => field.slice(2))
    .sort();
}

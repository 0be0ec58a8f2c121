import { InvalidLockOptionsError } from '../errors';
import { type LockOptions, MAX_LOCK_NAME_LENGTH } from '../options/dislock.options';
import { MAX_LOCK_SET } from '../options/options.validation';
import { describeLoneSurrogate, loneSurrogateAt } from '../options/well-formed';

/** A lock name as it is, once checked; throws `InvalidLockOptionsError` naming `name` otherwise. */
function checkLockName(where: string, name: unknown): string {
  if (typeof name !== 'string' || name.length === 0 || name.length > MAX_LOCK_NAME_LENGTH) {
    const got = typeof name === 'string' ? `a string of ${name.length} characters` : typeof name;
    throw new InvalidLockOptionsError(
      'name',
      `${where}: the lock name must be a non-empty string of at most ${MAX_LOCK_NAME_LENGTH} characters, got ${got}`,
    );
  }
  const lone = loneSurrogateAt(name);
  if (lone !== -1) {
    throw new InvalidLockOptionsError(
      'name',
      `${where}: the lock name must be well-formed Unicode: ${describeLoneSurrogate(name, lone)}`,
    );
  }
  return name;
}

/**
 * One lock name as it is, or a multi-lock's names: distinct and sorted (the canonical order every
 * caller takes them in), each checked. A multi-lock takes exclusive holds only.
 */
export function checkLockNames(
  where: string,
  name: unknown,
  options: LockOptions | undefined,
): string | readonly string[] {
  if (!Array.isArray(name)) return checkLockName(where, name);
  if (name.length === 0 || name.length > MAX_LOCK_SET) {
    throw new InvalidLockOptionsError(
      'name',
      `${where}: a multi-lock takes an array of 1 to ${MAX_LOCK_SET} lock names, got ${name.length}`,
    );
  }
  for (const option of ['mode', 'permits'] as const) {
    if (options?.[option] !== undefined) {
      throw new InvalidLockOptionsError(
        option,
        `${where}: a multi-lock (an array of names) takes exclusive holds only; "${option}" cannot be set with it`,
      );
    }
  }
  return [...new Set(name.map((part: unknown) => checkLockName(where, part)))].sort();
}

/** The names of a lock or a multi-lock, for messages. */
export function describeNames(name: string | readonly string[]): string {
  return typeof name === 'string' ? name : name.join(', ');
}

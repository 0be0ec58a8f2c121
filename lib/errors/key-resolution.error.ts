import { DisLockError } from './dislock.error';

/**
 * A lock key could not be resolved from the method's arguments (a placeholder reached `undefined`,
 * `null`, an object or a forbidden property, or the key is empty or too long). Thrown before Redis
 * is touched.
 */
export class KeyResolutionError extends DisLockError {
  constructor(
    /** The template (or `<function>` for a key function) that failed. */
    readonly template: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

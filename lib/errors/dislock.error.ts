/**
 * Base class of every error this library throws. Catch `DisLockError` to handle all of them at once.
 */
export class DisLockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * A one-line description of anything thrown, for messages and logs. Never throws itself: user code
 * can throw a null-prototype object, a value whose `toString` throws, or an Error whose `message`
 * is a throwing getter, and a message about it must still be built.
 */
export function describeError(error: unknown): string {
  try {
    if (error instanceof Error) return String(error.message);
    return String(error);
  } catch {
    try {
      return Object.prototype.toString.call(error);
    } catch {
      return 'an unprintable value';
    }
  }
}

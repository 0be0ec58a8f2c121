/**
 * Where the first lone surrogate of `text` is (a UTF-16 code unit of a surrogate pair without its
 * other half), or -1 when `text` is well-formed Unicode. A `u` regex reads a string by code points,
 * so a pair counts as one astral character and only a lone half is a surrogate code point (`Cs`).
 *
 * Names and prefixes must be well-formed: Redis keys are sent as UTF-8, which has no encoding for a
 * lone surrogate, so Node writes U+FFFD in its place, and `'s\uD800'`, `'s\uDBFF'` and `'s\uFFFD'`
 * would all be the one key `s�`, one lock shared by names the application tells apart.
 */
export function loneSurrogateAt(text: string): number {
  return text.search(/\p{Cs}/u);
}

/** What to say about a lone surrogate at `at` in a name or prefix, after "must be well-formed Unicode". */
export function describeLoneSurrogate(text: string, at: number): string {
  const unit = text.charCodeAt(at).toString(16).toUpperCase();
  return (
    `it has a lone surrogate (\\u${unit}) at position ${at}; ` +
    'Redis keys are sent as UTF-8, which replaces it with U+FFFD, so names that differ only there would share one lock'
  );
}

/**
 * Resolves once `check()` is true, polling every `everyMs` on real timers; rejects after
 * `timeoutMs`. (Vitest has `vi.waitFor`; Jest has no such helper.) Not for use under fake timers.
 */
export async function until(check: () => boolean, timeoutMs = 2_000, everyMs = 5): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms: ${check.toString()}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

/** What a scenario gives the child process: start (at a shared `t0`), then clean up. */
export interface CellRun {
  go(t0: number): Promise<unknown>;
  close(): Promise<void>;
}

export function describeError(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

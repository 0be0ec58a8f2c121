import { writeSync } from 'node:fs';

/**
 * One `@@{json}` line to the parent on stdout. Synchronous: nothing is lost when the process ends
 * right after, and no stream handle of the worker's own shows up among its open resources.
 */
export function report(event: string, data: object = {}): void {
  writeSync(1, `@@${JSON.stringify({ event, ...data })}\n`);
}

/**
 * Collect unhandled rejections and uncaught exceptions (the test runner cannot see a child's), and
 * report them with the exit code as the process exits.
 */
export function reportExit(): void {
  const unhandled: string[] = [];
  process.on('unhandledRejection', (reason) => unhandled.push(`unhandledRejection: ${String(reason)}`));
  process.on('uncaughtException', (error) => unhandled.push(`uncaughtException: ${String(error)}`));
  process.on('exit', (code) => report('exit', { code, unhandled }));
}

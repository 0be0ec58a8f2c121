import { type Provider } from '@nestjs/common';
import { type ArchivedReport, ReportArchive } from '../../src/reports/report-archive';

/**
 * `ReportArchive` in memory, with the same fencing rule as the Lua script: a write carrying a
 * fencing token smaller than the largest one seen for that report is refused.
 */
export class InMemoryReportArchive {
  /** Every write attempt, accepted or not, in order. */
  readonly writes: { name: string; fencingToken: number; steps: number; written: boolean }[] = [];
  private readonly records = new Map<string, ArchivedReport>();

  constructor(private readonly instance = 'test') {}

  async write(name: string, fencingToken: number, steps: number): Promise<boolean> {
    const stored = this.records.get(name);
    const written = !stored || fencingToken >= stored.fencingToken;
    if (written) this.records.set(name, { instance: this.instance, fencingToken, steps });
    this.writes.push({ name, fencingToken, steps, written });
    return written;
  }

  async read(name: string): Promise<ArchivedReport | null> {
    return this.records.get(name) ?? null;
  }
}

export function inMemoryReportArchive(archive = new InMemoryReportArchive()): Provider {
  return { provide: ReportArchive, useValue: archive };
}

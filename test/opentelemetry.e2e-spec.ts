/**
 * OpenTelemetry metrics and spans, read back through the SDK's own in-memory reader and exporter,
 * with locks on a real Redis.
 */
import { Injectable, Logger } from '@nestjs/common';
import { context, metrics, type Span, SpanStatusCode, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { type DataPoint, MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics';
import { InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import type { Redis } from 'ioredis';
import { DisLock } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { abortReason } from './support/async';
import { sharedClient, sleep } from './support/shared-redis';

class TestReader extends MetricReader {
  protected async onShutdown(): Promise<void> {}
  protected async onForceFlush(): Promise<void> {}
}

const reader = new TestReader();
const spans = new InMemorySpanExporter();
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
trace.setGlobalTracerProvider(new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter: spans })] }));
const tracer = trace.getTracer('test');

/** Every data point of the metric `name` now. */
async function points(name: string): Promise<DataPoint<unknown>[]> {
  const { resourceMetrics } = await reader.collect();
  return resourceMetrics.scopeMetrics
    .filter((scope) => scope.scope.name === 'nestjs-dislock')
    .flatMap((scope) => scope.metrics)
    .filter((metric) => metric.descriptor.name === name)
    .flatMap((metric) => metric.dataPoints as DataPoint<unknown>[]);
}

/** The data point of `name` whose attributes include `attributes`. */
async function point(name: string, attributes: Record<string, unknown>): Promise<DataPoint<unknown> | undefined> {
  return (await points(name)).find((p) => Object.entries(attributes).every(([k, v]) => p.attributes[k] === v));
}

const countOf = (p: DataPoint<unknown> | undefined): number =>
  p === undefined ? 0 : typeof p.value === 'number' ? p.value : (p.value as { count: number }).count;

/** The sum over every data point of `name` whose attributes include `attributes`. */
async function total(name: string, attributes: Record<string, unknown> = {}): Promise<number> {
  const matching = (await points(name)).filter((p) =>
    Object.entries(attributes).every(([k, v]) => p.attributes[k] === v),
  );
  return matching.reduce((sum, p) => sum + countOf(p), 0);
}

const parentOf = (span: ReadableSpan): string | undefined =>
  (span as unknown as { parentSpanContext?: { spanId: string } }).parentSpanContext?.spanId;

@Injectable()
class Jobs {
  @DisLock({ key: 'job:{0}', waitTime: 1_000 })
  async run(id: string): Promise<string> {
    const inner = tracer.startSpan('inside the job');
    await sleep(5);
    inner.end();
    return id;
  }

  @DisLock({ key: 'failing:{0}' })
  async fail(id: string): Promise<string> {
    throw new Error(`job ${id} broke`);
  }
}

describe('OpenTelemetry through @opentelemetry/api', () => {
  let a: TestApp;
  let named: TestApp;
  let off: TestApp;
  let redis: Redis;
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);

  beforeAll(async () => {
    redis = sharedClient();
    a = await createTestApp([Jobs]);
    named = await createTestApp([], { keyPrefix: a.prefix, telemetry: { lockNames: true } });
    off = await createTestApp([], { keyPrefix: a.prefix, telemetry: false });
  });

  afterAll(async () => {
    await Promise.all([a.close(), named.close(), off.close()]);
    redis.disconnect();
    warn.mockRestore();
  });

  beforeEach(() => spans.reset());

  it('an acquisition: counted by outcome, timed, and a span under the caller with the label, never the name', async () => {
    await tracer.startActiveSpan('request', async (request: Span) => {
      const held = await a.locks.lock('order:1', { label: 'order' });
      expect(await a.locks.tryLock('order:1', { label: 'order' })).toBeNull();
      await held.release();
      request.end();
    });
    const attributes = { 'dislock.lock': 'order', 'dislock.lock.kind': 'exclusive' };
    expect(countOf(await point('dislock.acquisitions', { ...attributes, 'dislock.outcome': 'acquired' }))).toBe(1);
    expect(countOf(await point('dislock.acquisitions', { ...attributes, 'dislock.outcome': 'busy' }))).toBe(1);
    expect(countOf(await point('dislock.acquire.duration', { ...attributes, 'dislock.outcome': 'acquired' }))).toBe(1);
    const request = spans.getFinishedSpans().find((s) => s.name === 'request') as ReadableSpan;
    const acquires = spans.getFinishedSpans().filter((s) => s.name === 'dislock.acquire');
    expect(acquires).toHaveLength(2);
    for (const span of acquires) {
      expect(parentOf(span)).toBe(request.spanContext().spanId);
      expect(span.attributes['dislock.lock']).toBe('order');
    }
    expect(acquires[0].attributes['dislock.fencing_token']).toEqual(expect.any(Number));
    expect(acquires[1].status.code).toBe(SpanStatusCode.ERROR);
    const everyValue = (await reader.collect()).resourceMetrics.scopeMetrics
      .flatMap((s) => s.metrics)
      .flatMap((m) => m.dataPoints.map((p) => Object.values(p.attributes)))
      .flat();
    expect(everyValue).not.toContain('order:1');
  });

  it('waiting is timed apart; the held gauge counts what the application holds', async () => {
    const first = await a.locks.lock('wait:1', { label: 'wait' });
    const second = await a.locks.lock('wait:2', { label: 'wait' });
    expect(await total('dislock.locks.held')).toBe(2);
    // Each lock held is counted under its own label and kind.
    expect(await total('dislock.locks.held', { 'dislock.lock': 'wait', 'dislock.lock.kind': 'exclusive' })).toBe(2);
    const waiting = a.locks.lock('wait:1', { label: 'wait', waitTime: 2_000 });
    await sleep(50);
    await first.release();
    await (await waiting).release();
    await second.release();
    const waited = await point('dislock.wait.duration', { 'dislock.lock': 'wait', 'dislock.outcome': 'acquired' });
    expect(countOf(waited)).toBe(1);
    expect((waited?.value as { sum: number }).sum).toBeGreaterThan(0.04);
    // Seconds, in buckets from 0.1 ms: a wait of ~50 ms does not land in the first one.
    const { boundaries, counts } = (waited?.value as { buckets: { boundaries: number[]; counts: number[] } }).buckets;
    expect(boundaries[0]).toBe(0.0001);
    expect(boundaries.at(-1)).toBeGreaterThanOrEqual(300);
    expect(counts[0]).toBe(0);
    expect(await total('dislock.locks.held')).toBe(0);
  });

  it('renewals (with their lag) and losses', async () => {
    const held = await a.locks.lock('renew:1', { label: 'renew', lockWatchdogTimeout: 300 });
    await sleep(450);
    await redis.del(a.prefix + 'renew:1');
    await abortReason(held.signal, 2_000);
    expect(countOf(await point('dislock.renewals', { 'dislock.lock': 'renew', 'dislock.outcome': 'renewed' }))).toBe(
      countOf(await point('dislock.renewal.lag', { 'dislock.lock': 'renew' })),
    );
    expect(countOf(await point('dislock.renewals', { 'dislock.lock': 'renew' }))).toBeGreaterThanOrEqual(2);
    expect(
      countOf(await point('dislock.losses', { 'dislock.lock': 'renew', 'dislock.lost.reason': 'not-owner' })),
    ).toBe(1);
  });

  it('a @DisLock method runs inside its own span, labelled with the key template; an error marks it', async () => {
    expect(await a.get(Jobs).run('42')).toBe('42');
    const finished = spans.getFinishedSpans();
    const method = finished.find((s) => s.name === 'dislock.locked Jobs.run') as ReadableSpan;
    expect(method.attributes).toMatchObject({ 'dislock.lock': 'job:{0}', 'code.function': 'Jobs.run' });
    const inner = finished.find((s) => s.name === 'inside the job') as ReadableSpan;
    expect(parentOf(inner)).toBe(method.spanContext().spanId);
    await expect(a.get(Jobs).fail('7')).rejects.toThrow('job 7 broke');
    const failed = spans.getFinishedSpans().find((s) => s.name === 'dislock.locked Jobs.fail') as ReadableSpan;
    expect(failed.status.code).toBe(SpanStatusCode.ERROR);
    expect(failed.events.some((e) => e.name === 'exception')).toBe(true);
    expect(countOf(await point('dislock.acquisitions', { 'dislock.lock': 'job:{0}' }))).toBe(1);
  });

  it('an application shut down while holding locks leaves the held count where it was', async () => {
    const before = await total('dislock.locks.held');
    const closing = await createTestApp([], { keyPrefix: a.prefix });
    await closing.locks.lock('shutdown:1', { label: 'shutdown' });
    await closing.locks.lock('shutdown:2', { label: 'shutdown' });
    expect(await total('dislock.locks.held')).toBe(before + 2);
    await closing.close();
    expect(await total('dislock.locks.held')).toBe(before);
    // Given up at shutdown, not lost: an alert on losses must not page on every deploy.
    expect(await total('dislock.losses', { 'dislock.lock': 'shutdown' })).toBe(0);
    expect(await total('dislock.locks.given_up', { 'dislock.lock': 'shutdown' })).toBe(2);
  });

  it('telemetry: { lockNames: true } labels with the resolved name; telemetry: false records nothing', async () => {
    await (await named.locks.lock('named:9')).release();
    expect(countOf(await point('dislock.acquisitions', { 'dislock.lock': 'named:9' }))).toBe(1);
    await (await off.locks.lock('quiet:1', { label: 'quiet' })).release();
    expect(await point('dislock.acquisitions', { 'dislock.lock': 'quiet' })).toBeUndefined();
    expect(spans.getFinishedSpans().filter((s) => s.attributes['dislock.lock'] === 'quiet')).toHaveLength(0);
  });
});

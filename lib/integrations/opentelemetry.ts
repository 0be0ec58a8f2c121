import { Inject, Injectable, Logger, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import type * as OpenTelemetry from '@opentelemetry/api';
import { describeError } from '../errors/describe-error';
import type { LockEvent, LockEventSubject } from '../events/lock-events';
import { DISLOCK_RESOLVED_OPTIONS } from '../options/dislock.internal-constants';
import type { ResolvedModuleOptions } from '../options/dislock.options';
import { LockService } from '../service/lock.service';

type Api = typeof OpenTelemetry;

/**
 * Bucket boundaries of the duration histograms, in seconds: 0.1 ms (an uncontended lock on a near
 * Redis) up to 5 minutes, about 2.5x apart. Without them an SDK's default buckets (0 to 10,000, made
 * for milliseconds) would put every acquisition in the first.
 */
const DURATION_BUCKETS_S = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
];

/** The instrumentation scope every meter and tracer of the library is named after. */
export const INSTRUMENTATION_SCOPE = 'nestjs-dislock';

/** `@opentelemetry/api` when the application has it installed (an optional peer), else undefined. */
function loadApi(): Api | undefined {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- an optional peer: absent means no telemetry
    return require('@opentelemetry/api') as Api;
  } catch {
    return undefined;
  }
}

/** A span around one locked method: active while it runs, ended with its outcome. */
export interface MethodSpan {
  run<T>(fn: () => T): T;
  end(error?: unknown): void;
}

/**
 * OpenTelemetry for the locks of one application, through `@opentelemetry/api` when it is
 * installed and an SDK is registered when the module starts (its meter and tracer providers;
 * either may be absent): nothing at all without them, or with `telemetry: false`. Built on the
 * lock events:
 *
 * Metrics (meter `nestjs-dislock`):
 * - `dislock.acquire.duration` (histogram, s): each acquisition's whole time, by `dislock.outcome`
 *   (`acquired` | `busy`);
 * - `dislock.wait.duration` (histogram, s): the same, for acquisitions that had to wait;
 * - `dislock.acquisitions` (counter): by `dislock.outcome`;
 * - `dislock.locks.held` (up-down counter): locks held now, by every application of the process;
 * - `dislock.locks.given_up` (counter): locks given up because the application shut down while
 *   holding them (not losses: the work they protected was being stopped anyway);
 * - `dislock.renewals` (counter): by `dislock.outcome` (`renewed` | `failed`);
 * - `dislock.renewal.lag` (histogram, s): how late each renewal went out;
 * - `dislock.losses` (counter): by `dislock.lost.reason` (never `shutdown`: see above).
 * The durations are in seconds with bucket boundaries advised from 0.1 ms to 5 minutes (or the
 * module's default `waitTime`, when longer), so that a p99 near `waitTime` can be told apart.
 * Every one carries `dislock.lock` (the lock's label: a `@DisLock` key template, never the
 * resolved name unless `telemetry: { lockNames: true }`) and `dislock.lock.kind`.
 *
 * Spans (tracer `nestjs-dislock`): `dislock.acquire` for each acquisition (its start, end and
 * outcome; an error status when busy), and `dislock.locked <Class.method>` around each
 * `@DisLock` method, active while it runs so that its own spans are children of it.
 */
@Injectable()
export class DisLockTelemetry implements OnModuleInit, OnApplicationShutdown {
  private readonly api: Api | undefined;
  private readonly stops: (() => void)[] = [];
  private tracer: OpenTelemetry.Tracer | undefined;
  private readonly logger = new Logger('DisLock');

  constructor(
    @Inject(DISLOCK_RESOLVED_OPTIONS) private readonly options: ResolvedModuleOptions,
    private readonly locks: LockService,
  ) {
    this.api = options.telemetry.enabled ? loadApi() : undefined;
  }

  onModuleInit(): void {
    const api = this.api;
    if (!api) return;
    try {
      this.instrument(api);
    } catch (error) {
      // A broken SDK must not stop the application; locking works without telemetry.
      this.logger.warn(`OpenTelemetry instrumentation is off: ${describeError(error)}`);
    }
  }

  /** After the locks were given up at shutdown (their losses and the held count are recorded). */
  onApplicationShutdown(): void {
    for (const stop of this.stops.splice(0)) stop();
  }

  /** Whether locked methods get spans: an SDK's tracer provider is registered. */
  get traces(): boolean {
    return this.tracer !== undefined;
  }

  /** A span for one run of a locked method, or undefined without tracing. */
  startMethod(method: string, subject: LockEventSubject): MethodSpan | undefined {
    const api = this.api;
    const tracer = this.tracer;
    if (!api || !tracer) return undefined;
    const span = tracer.startSpan(`dislock.locked ${method}`, {
      attributes: { ...this.attributes(subject), 'code.function': method },
    });
    const active = api.trace.setSpan(api.context.active(), span);
    return {
      run: (fn) => api.context.with(active, fn),
      end: (error) => {
        if (error !== undefined) {
          span.recordException(error instanceof Error ? error : new Error(describeError(error)));
          span.setStatus({ code: api.SpanStatusCode.ERROR, message: describeError(error) });
        }
        span.end();
      },
    };
  }

  private instrument(api: Api): void {
    const meter = api.metrics.getMeter(INSTRUMENTATION_SCOPE);
    const tracer = api.trace.getTracer(INSTRUMENTATION_SCOPE);
    // Without an SDK the API hands out no-op meters and proxy tracers: then nothing is subscribed,
    // and the locks cost what they cost with `telemetry: false`.
    if (!(tracer instanceof api.ProxyTracer)) this.tracer = tracer;
    if (!(meter instanceof api.createNoopMeter().constructor)) this.measure(meter);
    const traced = this.tracer;
    if (!traced) return;
    const span = (event: LockEvent<'acquired'> | LockEvent<'busy'>): void => {
      if (event.type === 'acquired' && event.reentrant) return;
      const acquire = traced.startSpan('dislock.acquire', {
        startTime: event.at - event.waitedMs,
        attributes: {
          ...this.attributes(event),
          'dislock.outcome': event.type === 'acquired' ? 'acquired' : 'busy',
          'dislock.waited': event.waited,
          ...(event.type === 'acquired' && { 'dislock.fencing_token': event.fencingToken }),
        },
      });
      if (event.type === 'busy') acquire.setStatus({ code: api.SpanStatusCode.ERROR, message: 'lock busy' });
      acquire.end(event.at);
    };
    this.stops.push(this.locks.on('acquired', span), this.locks.on('busy', span));
  }

  /** The metrics, on a meter of a registered SDK. */
  private measure(meter: OpenTelemetry.Meter): void {
    const longest = Math.max(300, this.options.waitTime / 1_000);
    const seconds = {
      unit: 's',
      advice: { explicitBucketBoundaries: [...DURATION_BUCKETS_S.filter((s) => s < longest), longest] },
    };
    const acquireDuration = meter.createHistogram('dislock.acquire.duration', {
      ...seconds,
      description: 'Time to take a lock (or to give up on a busy one)',
    });
    const waitDuration = meter.createHistogram('dislock.wait.duration', {
      ...seconds,
      description: 'Time to take a lock that had to be waited for (or to give up)',
    });
    const acquisitions = meter.createCounter('dislock.acquisitions', { description: 'Acquisitions by outcome' });
    const renewals = meter.createCounter('dislock.renewals', { description: 'Watchdog renewals by outcome' });
    const renewalLag = meter.createHistogram('dislock.renewal.lag', {
      ...seconds,
      description: 'How late each renewal went out after it was due',
    });
    const losses = meter.createCounter('dislock.losses', { description: 'Locks lost while held, by reason' });
    const givenUp = meter.createCounter('dislock.locks.given_up', {
      description: 'Locks given up because the application shut down while holding them',
    });
    // An up-down counter rather than a gauge: the applications of one process add up, never overwrite each other.
    const held = meter.createUpDownCounter('dislock.locks.held', { description: 'Locks held (kept) now' });
    const acquisition = (event: LockEvent<'acquired'> | LockEvent<'busy'>): void => {
      if (event.type === 'acquired' && event.reentrant) return;
      const outcome = event.type === 'acquired' ? 'acquired' : 'busy';
      const attributes = { ...this.attributes(event), 'dislock.outcome': outcome };
      acquireDuration.record(event.waitedMs / 1_000, attributes);
      if (event.waited) waitDuration.record(event.waitedMs / 1_000, attributes);
      acquisitions.add(1, attributes);
    };
    this.stops.push(
      this.locks.onHeldChange((delta, lock) => held.add(delta, this.attributes(lock))),
      this.locks.on('acquired', acquisition),
      this.locks.on('busy', acquisition),
      this.locks.on('renewed', (event) => {
        const attributes = this.attributes(event);
        renewals.add(1, { ...attributes, 'dislock.outcome': 'renewed' });
        renewalLag.record(event.lagMs / 1_000, attributes);
      }),
      this.locks.on('renewal-failed', (event) => {
        renewals.add(1, { ...this.attributes(event), 'dislock.outcome': 'failed' });
      }),
      this.locks.on('lost', (event) => {
        if (event.reason === 'shutdown') givenUp.add(1, this.attributes(event));
        else losses.add(1, { ...this.attributes(event), 'dislock.lost.reason': event.reason });
      }),
    );
  }

  private attributes(subject: LockEventSubject): OpenTelemetry.Attributes {
    const lock = this.options.telemetry.lockNames ? subject.name : (subject.label ?? '(no label)');
    return { 'dislock.lock': lock, 'dislock.lock.kind': subject.kind };
  }
}

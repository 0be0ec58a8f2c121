import type { Logger } from '@nestjs/common';
import type { ResolvedModuleOptions } from '../options/dislock.options';
import type { LockStore, StoredHold, StoredLock } from '../store/lock-store.interface';
import type { HeldLocks } from './held-locks';
import { redisFailed } from './redis-failed';

/** One holder of a lock, as `LockService.inspect` and `forceUnlock` report it. */
export interface LockHolder {
  /** The owner id (a grant not yet taken up: `<waiter id>:<token>`). */
  readonly owner: string;
  /** `'exclusive'`: a plain lock or a writer; `'shared'`: a reader or a semaphore permit. */
  readonly kind: 'exclusive' | 'shared';
  /** ms left of its lease (-1: no expiry). */
  readonly ttl: number;
  /** Handed over by a release and not taken up yet by the waiter's first renewal. */
  readonly granted: boolean;
  /** Its fencing token, when its acquisition recorded one. */
  readonly fencingToken?: number;
  /** When it got the lock, as recorded at its acquisition. */
  readonly since?: Date;
  /** Where it runs and what took the lock, as recorded at its acquisition. */
  readonly host?: string;
  readonly pid?: number;
  /** The module's `appName`. */
  readonly app?: string;
  /** The lock's `label` (a `@DisLock` key template). */
  readonly label?: string;
  /** `Class.method` of the `@DisLock` method that took it. */
  readonly caller?: string;
  /** Whether this application holds it. */
  readonly mine: boolean;
  /** Holds of this owner in this application (outermost and reentrant); only when `mine`. */
  readonly holds?: number;
}

/** What `LockService.inspect` finds for one lock. */
export interface LockInspection {
  /** The lock name, without the key prefix. */
  readonly name: string;
  readonly key: string;
  readonly held: boolean;
  readonly holders: readonly LockHolder[];
  /** Processes waiting in the lock's line. */
  readonly waiting: number;
}

/** The recorded description's fields, or none when it cannot be read. */
function describedBy(
  description: string | undefined,
): Partial<Pick<LockHolder, 'host' | 'pid' | 'app' | 'label' | 'caller'>> {
  if (!description) return {};
  try {
    const parsed = JSON.parse(description) as Record<string, unknown>;
    const text = (field: string): string | undefined => (typeof parsed[field] === 'string' ? parsed[field] : undefined);
    return {
      host: text('host'),
      pid: typeof parsed.pid === 'number' ? parsed.pid : undefined,
      app: text('app'),
      label: text('label'),
      caller: text('caller'),
    };
  } catch {
    return {};
  }
}

/** A stored hold as a holder report; `holds` is this application's count for it, if it is its own. */
export function holderOf(hold: StoredHold, holds: number | undefined): LockHolder {
  const recorded = hold.recorded;
  const described = Object.fromEntries(
    Object.entries(describedBy(recorded?.description)).filter(([, value]) => value !== undefined),
  );
  return {
    owner: hold.owner,
    kind: hold.exclusive ? 'exclusive' : 'shared',
    ttl: hold.ttl,
    granted: hold.granted,
    ...(recorded?.fencingToken !== undefined && { fencingToken: recorded.fencingToken }),
    ...(recorded && { since: new Date(recorded.since) }),
    ...described,
    mine: holds !== undefined,
    ...(holds !== undefined && { holds }),
  };
}

/** A lock as `inspect` reports it. */
export function inspectionOf(
  name: string,
  key: string,
  stored: StoredLock,
  holdsOf: (owner: string) => number | undefined,
): LockInspection {
  return {
    name,
    key,
    held: stored.held,
    holders: stored.holds.map((hold) => holderOf(hold, holdsOf(hold.owner))),
    waiting: stored.waiting,
  };
}

/** One line for the log: who a holder is. */
export function describeHolder(holder: LockHolder): string {
  const where = [holder.app, holder.host && `${holder.host}:${holder.pid ?? '?'}`].filter(Boolean).join(' on ');
  const what = holder.caller ?? holder.label;
  const since = holder.since ? `, held since ${holder.since.toISOString()}` : '';
  return `owner ${holder.owner}${where ? ` (${where}${what ? `, ${what}` : ''})` : what ? ` (${what})` : ''}${since}`;
}

/** What an operator asks of the locks: `LockService.inspect` and `forceUnlock`. */
export class Operator {
  constructor(
    private readonly options: ResolvedModuleOptions,
    private readonly store: LockStore,
    private readonly held: HeldLocks,
    private readonly logger: Logger,
  ) {}

  async inspect(name: string): Promise<LockInspection> {
    const key = this.options.keyPrefix + name;
    let stored;
    try {
      stored = await this.store.inspect(key);
    } catch (error) {
      throw redisFailed('inspect', name, error);
    }
    return inspectionOf(name, key, stored, (owner) => this.held.holdsOf(key, owner));
  }

  async forceUnlock(name: string): Promise<LockHolder[]> {
    const key = this.options.keyPrefix + name;
    let removed;
    try {
      removed = await this.store.forceUnlock(key);
    } catch (error) {
      throw redisFailed('release', name, error);
    }
    const holders = removed.map((hold) => holderOf(hold, this.held.holdsOf(key, hold.owner)));
    const who = holders.length === 0 ? 'it was free' : `removed ${holders.map(describeHolder).join('; ')}`;
    this.logger.warn(`Lock "${name}" force-unlocked: ${who}`);
    // A holder in this application is told now; others find out at their next renewal or check.
    this.held.loseOwners(
      key,
      removed.map((hold) => hold.owner),
      'an operator force-unlocked it (LockService.forceUnlock in this application)',
    );
    return holders;
  }
}

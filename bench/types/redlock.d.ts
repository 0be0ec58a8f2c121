// redlock 5.0.0-beta.2 ships its types only for its ESM build ("exports" has no "types" condition),
// so a CommonJS project under `moduleResolution: nodenext` sees none. The part the benchmark uses:
declare module 'redlock' {
  import type { EventEmitter } from 'node:events';
  import type { Cluster, Redis } from 'ioredis';

  export interface Settings {
    readonly driftFactor: number;
    readonly retryCount: number;
    readonly retryDelay: number;
    readonly retryJitter: number;
    readonly automaticExtensionThreshold: number;
  }

  export class ExecutionError extends Error {}

  export class Lock {
    readonly resources: string[];
    readonly value: string;
    expiration: number;
    release(): Promise<unknown>;
  }

  export default class Redlock extends EventEmitter {
    constructor(clients: Iterable<Redis | Cluster>, settings?: Partial<Settings>);
    readonly settings: Settings;
    acquire(resources: string[], duration: number, settings?: Partial<Settings>): Promise<Lock>;
  }
}

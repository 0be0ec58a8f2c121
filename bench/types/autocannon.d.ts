// autocannon 8 ships no types; the part of its programmatic API the benchmark uses.
declare module 'autocannon' {
  interface Histogram {
    readonly average: number;
    readonly mean: number;
    readonly stddev: number;
    readonly min: number;
    readonly max: number;
    readonly total: number;
    readonly p50: number;
    readonly p90: number;
    readonly p99: number;
  }

  interface RequestData {
    method?: string;
    path?: string;
    headers?: Record<string, string>;
    body?: string | Buffer;
  }

  interface Options {
    url: string;
    connections?: number;
    /** Seconds; autocannon stops on its next 1 s tick after this. */
    duration?: number;
    pipelining?: number;
    timeout?: number;
    requests?: (RequestData & { setupRequest?: (request: RequestData) => RequestData })[];
  }

  interface Result {
    readonly latency: Histogram;
    readonly requests: Histogram;
    readonly duration: number;
    readonly errors: number;
    readonly timeouts: number;
    readonly non2xx: number;
    readonly '2xx': number;
  }

  /** An EventEmitter that is also a promise of the result. */
  interface Tracker extends PromiseLike<Result> {
    on(
      event: 'response',
      listener: (client: unknown, statusCode: number, resBytes: number, responseTimeMs: number) => void,
    ): this;
  }

  function autocannon(options: Options): Tracker;
  export = autocannon;
}

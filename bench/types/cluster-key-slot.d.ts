// cluster-key-slot 1.1.1 (the version ioredis pins, so there is one copy) ships no types.
declare module 'cluster-key-slot' {
  /** The Redis Cluster hash slot of a key (its `{hash tag}` if it has a non-empty one). */
  function calculate(value: string | Buffer): number;
  export = calculate;
}

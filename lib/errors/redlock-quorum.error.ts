import { describeError } from './describe-error';
import { RedisUnavailableError } from './redis-unavailable.error';

/** One Redlock node that failed an operation: its address and what it reported. */
export interface RedlockNodeFailure {
  /** `host:port` (or the socket path) of the node; never credentials. */
  readonly node: string;
  /** What the node's client reported: a timeout, a connection error, an error reply. */
  readonly error: unknown;
}

/**
 * Redlock: so many nodes failed (no answer within `operationTimeout`, a connection down, an error
 * reply) that the operation could not reach a majority of them. A `RedisUnavailableError`, so it
 * is answered 503 and handled like a single Redis being down.
 *
 * The message says only how many nodes failed (`Could not acquire lock "x": 2 of 3 Redis nodes
 * failed, no majority of 2 possible`): it may reach an HTTP client (Nest 11 before 11.2.8 sends it as the body).
 * Which nodes failed and why is in `nodes` and in `cause`, an `AggregateError` whose message names
 * each node and its error, so that Nest's logger prints it with the error.
 */
export class RedlockQuorumError extends RedisUnavailableError {
  constructor(
    operation: string,
    lockName: string,
    /** Every node that failed, with its error. */
    readonly nodes: readonly RedlockNodeFailure[],
    /** How many nodes the Redlock set has. */
    readonly nodeCount: number,
    /** Nodes needed for a majority: ⌊nodeCount / 2⌋ + 1. */
    readonly quorum: number,
  ) {
    super(
      operation,
      lockName,
      `Could not ${operation} lock "${lockName}": ${nodes.length} of ${nodeCount} Redis nodes failed, no majority of ${quorum} possible`,
      {
        cause: new AggregateError(
          nodes.map((failure) => failure.error),
          `Redlock nodes failed: ${nodes.map((failure) => `${failure.node}: ${describeError(failure.error)}`).join('; ')}`,
        ),
      },
    );
  }
}

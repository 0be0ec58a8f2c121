import { describeError } from '../../errors/describe-error';
import { withoutAddresses } from '../../errors/without-addresses';
import { SlotMigratingError, StoreDisconnectedError, StoreTimeoutError } from '../store-errors';

/** Node's and OpenSSL's error codes, as a reason that names no address. */
const BY_CODE: Readonly<Record<string, string>> = {
  ECONNREFUSED: 'connection refused',
  ECONNRESET: 'connection reset',
  ECONNABORTED: 'connection aborted',
  EPIPE: 'connection broken',
  ETIMEDOUT: 'connection timed out',
  ENOTFOUND: 'host name not found',
  EAI_AGAIN: 'host name lookup failed',
  EAI_NONAME: 'host name not found',
  EHOSTUNREACH: 'host unreachable',
  EHOSTDOWN: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ENETDOWN: 'network unreachable',
  ENOENT: 'socket not found',
  EACCES: 'permission denied',
  ERR_TLS_CERT_ALTNAME_INVALID: 'TLS certificate rejected (it does not name the host)',
  DEPTH_ZERO_SELF_SIGNED_CERT: 'TLS certificate rejected (self-signed)',
  SELF_SIGNED_CERT_IN_CHAIN: 'TLS certificate rejected (self-signed in chain)',
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: 'TLS certificate rejected (unknown issuer)',
  UNABLE_TO_GET_ISSUER_CERT_LOCALLY: 'TLS certificate rejected (unknown issuer)',
  CERT_HAS_EXPIRED: 'TLS certificate rejected (expired)',
};

/** Redis's and ioredis's messages, as a reason that names no address. */
const BY_MESSAGE: readonly (readonly [RegExp, string])[] = [
  [/^(WRONGPASS|NOAUTH)\b|invalid (username-)?password/i, 'authentication failed'],
  [/^NOPERM\b/, 'permission denied (ACL)'],
  [/^LOADING\b/, 'Redis is loading its data set'],
  [/^OOM\b/, 'Redis is out of memory'],
  [/^READONLY\b/, 'connected to a read-only replica'],
  [/^MASTERDOWN\b/, 'the master is down'],
  [/^CLUSTERDOWN\b/, 'the Cluster is down'],
  [/^BUSY\b/, 'Redis is busy running a script'],
  [/command timed out/i, 'timed out'],
  [/^Connection is closed/i, 'connection closed'],
  [/enableOfflineQueue options is false|isn't ready and enableOfflineQueue/i, 'not connected'],
  [/Failed to refresh slots cache|None of startup nodes is available/i, 'no Cluster node answered'],
  [/All sentinels are unreachable/i, 'no Sentinel answered'],
  [/Reached the max retries per request limit/i, 'not connected (maxRetriesPerRequest reached)'],
  [/certificate|TLS|SSL/i, 'TLS handshake failed'],
];

/** A reason for `error` (a connection or Redis error) that names no address and no password. */
export function reasonOf(error: unknown): string {
  const code = typeof error === 'object' && error !== null ? (error as { code?: unknown }).code : undefined;
  if (typeof code === 'string' && BY_CODE[code]) return BY_CODE[code];
  const message = describeError(error);
  for (const [pattern, reason] of BY_MESSAGE) if (pattern.test(message)) return reason;
  if (typeof code === 'string' && /^[A-Z][A-Z0-9_]+$/.test(code)) return `connection failed (${code})`;
  return withoutAddresses(message).slice(0, 200);
}

/**
 * Why a health probe failed, for a health check's body (which may reach any HTTP client): what
 * failed and why (`Redis is unreachable (connection refused)`, `Redis did not answer within 5000 ms
 * (authentication failed)`), never the server's address or a password.
 */
export function healthProblem(error: unknown): string {
  if (error instanceof StoreDisconnectedError) return `Redis is unreachable (${reasonOf(error.cause)})`;
  if (error instanceof StoreTimeoutError) {
    const why = error.connectionError ? ` (${reasonOf(error.connectionError)})` : '';
    return `Redis did not answer within ${error.timeoutMs} ms${why}`;
  }
  if (error instanceof SlotMigratingError) return withoutAddresses(error.message);
  return `Redis failed: ${reasonOf(error)}`;
}

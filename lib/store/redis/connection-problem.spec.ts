import { withoutAddresses } from '../../errors/without-addresses';
import { StoreDisconnectedError, StoreTimeoutError } from '../store-errors';
import { healthProblem, reasonOf } from './connection-problem';

/** An error as Node's net, dns and tls modules make them: a message naming where, and a code. */
function systemError(message: string, code: string): Error {
  return Object.assign(new Error(message), { code });
}

describe('healthProblem: why Redis is down, in words that name no address and no password', () => {
  const refused = systemError('connect ECONNREFUSED 10.1.2.3:6380', 'ECONNREFUSED');

  it.each<[string, unknown, string]>([
    ['known down', new StoreDisconnectedError(refused), 'Redis is unreachable (connection refused)'],
    [
      'a timeout while down',
      new StoreTimeoutError(300, new Error('WRONGPASS invalid username-password pair or user is disabled.')),
      'Redis did not answer within 300 ms (authentication failed)',
    ],
    ['a timeout', new StoreTimeoutError(5_000), 'Redis did not answer within 5000 ms'],
    [
      'a host name not found',
      systemError('getaddrinfo ENOTFOUND redis.internal.example', 'ENOTFOUND'),
      'Redis failed: host name not found',
    ],
    ['timed out', systemError('connect ETIMEDOUT', 'ETIMEDOUT'), 'Redis failed: connection timed out'],
    ['a redirection', new Error('MOVED 3999 10.0.0.7:7002'), 'Redis failed: MOVED 3999 <address>'],
    ['a URL', new Error('cannot reach redis://user:pw@cache:6379/0'), 'Redis failed: cannot reach <address>'],
  ])('%s', (_label, error, expected) => {
    expect(healthProblem(error)).toBe(expected);
  });

  it('keeps the reasons short and code-named when it knows nothing better', () => {
    expect(reasonOf(systemError('write EPROTO 10.1.2.3:6380', 'EPROTO'))).toBe('connection failed (EPROTO)');
    expect(reasonOf(new Error('LOADING Redis is loading the dataset in memory'))).toBe('Redis is loading its data set');
  });
});

describe('withoutAddresses', () => {
  it.each([
    ['connect ECONNREFUSED 127.0.0.1:6379', 'connect ECONNREFUSED <address>'],
    ['connect ECONNREFUSED ::1:6379', 'connect ECONNREFUSED <address>'],
    ['at [fe80::1]:6379', 'at <address>'],
    ['redis-0.redis.svc:6379 is down', '<address> is down'],
    ['rediss://default:secret@host/0', '<address>'],
  ])('%s', (text, expected) => {
    expect(withoutAddresses(text)).toBe(expected);
  });

  it('leaves the library’s own words alone', () => {
    for (const text of [
      'Redis is unreachable (connection refused)',
      'lock renewals run 700 ms late (more than 500 ms)',
      '1 of 3 nodes answer, 2 needed (node 2: Redis is unreachable (connection refused))',
      "Redis refuses command 'eval'",
      'ERR user_script:1: Script attempted to access nonexistent global variable',
    ]) {
      expect(withoutAddresses(text)).toBe(text);
    }
  });
});

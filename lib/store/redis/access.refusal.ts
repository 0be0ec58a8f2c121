import { describeError } from '../../errors/describe-error';

/** What Redis refused, as one item of `RedisAccessError.denied`, or `undefined` if it was not a refusal. */
export function refusal(error: unknown, key: string, channel: string): string | undefined {
  const message = describeError(error);
  if (
    /unknown command '?(eval|evalsha)'?/i.test(message) ||
    /script(s|ing)?\b[^.]*\b(disabled|not (allowed|enabled|supported))/i.test(message)
  ) {
    return 'scripting (EVAL/EVALSHA)';
  }
  // Redis 6.2/7.0: "NOPERM this user has no permissions to run the 'x' command", "... to access
  // one of the keys/channels ..."; inside a script (7.0): "The user executing the script can't
  // run this command or subcommand" / "can't publish to the channel"; Redis >= 7.2: "NOPERM User u
  // has no permissions to run the 'x' command", "No permissions to access a key", and inside a
  // script "ACL failure in script: ...".
  if (!/NOPERM|no permissions|ACL failure|user executing the script can't/i.test(message)) return undefined;
  const command = /'([^']+)' command/.exec(message);
  if (command) return `command '${command[1].toLowerCase()}'`;
  if (/channel/i.test(message)) return `channel "${channel}"`;
  if (/\bkeys?\b/i.test(message)) return `key "${key}"`;
  return 'a command a script calls';
}

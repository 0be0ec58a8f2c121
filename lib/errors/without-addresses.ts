/** `scheme://anything` up to a space: a URL, which may hold a user and password. */
const URL_PATTERN = /\b[a-z][a-z0-9+.-]*:\/\/[^\s,;)'"]+/gi;
/** `[v6]:port`, or a bare IPv6 address of at least three groups. */
const IPV6_PATTERN = /\[[0-9a-f:.%]+\](:\d+)?|(?<![\w:.])(?:[0-9a-f]{0,4}:){2,8}[0-9a-f]{0,4}(?![\w:])/gi;
/** `a.b.c.d`, with a port or not. */
const IPV4_PATTERN = /\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b/g;
/** `host:port`, `host.domain:port`. */
const HOST_PORT_PATTERN = /\b[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9-]+)*:\d{1,5}\b/gi;

/**
 * `text` with every network address in it (a URL, an IPv4 or IPv6 address, a `host:port`) replaced
 * by `<address>`: for what may reach an HTTP client, such as a health check's body. A safety net
 * for text the library does not build itself; what it builds names no address in the first place.
 */
export function withoutAddresses(text: string): string {
  return text
    .replace(URL_PATTERN, '<address>')
    .replace(IPV4_PATTERN, '<address>')
    .replace(IPV6_PATTERN, (match) => (/\d/.test(match) || match.startsWith('[') ? '<address>' : match))
    .replace(HOST_PORT_PATTERN, '<address>');
}

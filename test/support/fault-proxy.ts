/**
 * A loopback TCP proxy between Redis clients and a test-owned `redis-server` that injects network
 * faults at the level of single commands. It parses RESP in both directions, so it knows which
 * reply answers which command on each connection (Redis answers in order on a connection; a
 * connection that entered subscriber mode is passed through without correlation).
 *
 * ```ts
 * const proxy = await FaultProxy.start(server.port);
 * const client = new Redis(proxy.port);            // or DisLockModule.forRoot({ redis: proxy.url })
 * const dropped = proxy.dropReply(isScript(RELEASE_SCRIPT)); // Redis runs it, the client never hears
 * await dropped;                                     // resolves once it happened (with the command)
 * proxy.delayReply(isScript(ACQUIRE_SCRIPT), 300);   // the next acquire's reply arrives 300 ms late
 * proxy.resetConnections('subscriber');              // like CLIENT KILL TYPE pubsub, seen from the client
 * proxy.blackhole(500);                              // nothing passes either way for 500 ms, then it flows again
 * await proxy.close();
 * ```
 *
 * Rules every fault follows:
 * - Faults are armed in call order and each applies once. A command is matched when the proxy
 *   forwards it to Redis, so a command already sent when the fault is armed is never matched.
 *   When several armed faults accept a command, the one armed first takes it.
 * - Commands of a connection whose replies the proxy does not correlate (after (P|S)SUBSCRIBE,
 *   MONITOR or CLIENT REPLY OFF, and on a stalled connection) are logged but never matched.
 * - A fault whose connection closes before it took effect (the reply never arrived, or a delayed
 *   reply was never delivered) is armed again at its place in the order, so it applies to the
 *   command the client re-sends after reconnecting.
 * - `close()` rejects the promise of every fault still pending with `FaultCancelledError`; those
 *   promises are marked handled up front, so a test that never awaits one gets no unhandled
 *   rejection. A reply held by `delayReply` is delivered early by `close()` and its promise resolves.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';

export type CommandMatcher = (argv: readonly string[]) => boolean;

/** Which client connections a reset applies to. */
export type ConnectionKind = 'all' | 'subscriber' | 'command';

export interface DropOptions {
  /**
   * What happens to the connection after the reply is dropped:
   * - 'reset' (default): the client's socket is destroyed right away (the client sees the
   *   connection close with the command unanswered; ioredis then reconnects and, by default,
   *   re-sends it).
   * - 'stall': the connection stays open but nothing more is delivered to the client on it
   *   (later commands still reach Redis and run) until `resetConnections()` or `close()`.
   */
  readonly then?: 'reset' | 'stall';
}

/** A command the proxy saw, as its arguments (the first is the command name, as sent). */
export interface SeenCommand {
  readonly argv: readonly string[];
  /** Which client connection (numbered from 1 in accept order) sent it. */
  readonly connection: number;
}

/** The rejection of a fault that was still pending when the proxy closed. */
export class FaultCancelledError extends Error {
  constructor() {
    super('FaultProxy closed before this fault took effect');
    this.name = 'FaultCancelledError';
  }
}

/** Matches a command by name (case-insensitive) and, optionally, its first arguments (compared exactly). */
export function isCommand(name: string, ...args: string[]): CommandMatcher {
  const wanted = name.toLowerCase();
  return (argv) =>
    argv.length > args.length && argv[0].toLowerCase() === wanted && args.every((arg, i) => argv[i + 1] === arg);
}

/** Matches EVALSHA or EVAL (and their _RO forms) of one of the library's Lua scripts (by its sha or source). */
export function isScript(script: { readonly sha: string; readonly source: string }): CommandMatcher {
  const sha = script.sha.toLowerCase();
  return (argv) => {
    if (argv.length < 2) return false;
    const name = argv[0].toLowerCase();
    if (name === 'evalsha' || name === 'evalsha_ro') return argv[1].toLowerCase() === sha;
    if (name === 'eval' || name === 'eval_ro') return argv[1] === script.source;
    return false;
  };
}

const LF = 0x0a;
const CR = 0x0d;
const STAR = 0x2a; // '*'
const DOLLAR = 0x24; // '$'
const PUSH = 0x3e; // '>'
const QUESTION = 0x3f; // '?', the length of a RESP3 streamed string or aggregate

/** An integer written in ASCII in `line` from `from` on; NaN when it is not one. */
function lineInteger(line: Buffer, from: number): number {
  const text = line.toString('latin1', from);
  return /^-?\d+$/.test(text) ? Number(text) : NaN;
}

/**
 * Cuts protocol lines out of a stream of chunks. A line may be split over chunks; its pieces are
 * kept as views of those chunks (no copy) and joined once it is complete. Lines are headers, short;
 * the payloads of bulk strings are never read through here.
 */
class LineReader {
  /** The last complete line read, without its CRLF. */
  line: Buffer = Buffer.alloc(0);
  private parts: Buffer[] = [];

  /** True while part of a line has been read. */
  get partial(): boolean {
    return this.parts.length > 0;
  }

  /** Reads the line that continues at `from`: the offset after its LF, or -1 (the piece is kept) when it does not end in `chunk`. */
  read(chunk: Buffer, from: number): number {
    const lf = chunk.indexOf(LF, from);
    if (lf < 0) {
      this.parts.push(chunk.subarray(from));
      return -1;
    }
    let line = chunk.subarray(from, lf);
    if (this.parts.length > 0) {
      this.parts.push(line);
      line = Buffer.concat(this.parts);
      this.parts = [];
    }
    this.line = line.length > 0 && line[line.length - 1] === CR ? line.subarray(0, -1) : line;
    return lf + 1;
  }
}

/**
 * Splits the client's byte stream into commands: RESP arrays of bulk strings (all ioredis sends)
 * or inline commands (`PING\r\n`). It never changes the bytes, it only reports what they carry.
 */
class CommandParser {
  private readonly lines = new LineReader();
  /** Bulk strings the current array still announces; 0 between commands. */
  private argsLeft = 0;
  private args: string[] = [];
  /** Bytes (payload and CRLF) of the current bulk string still to come; -1 when reading a header line. */
  private bulkLeft = -1;
  private bulkParts: Buffer[] = [];

  feed(chunk: Buffer, onCommand: (argv: string[]) => void): void {
    let pos = 0;
    while (pos < chunk.length) {
      if (this.bulkLeft >= 0) {
        const take = Math.min(this.bulkLeft, chunk.length - pos);
        this.bulkParts.push(chunk.subarray(pos, pos + take));
        pos += take;
        this.bulkLeft -= take;
        if (this.bulkLeft > 0) return;
        // One concat per argument, however many chunks a large value came in.
        const payload = this.bulkParts.length === 1 ? this.bulkParts[0] : Buffer.concat(this.bulkParts);
        this.bulkParts = [];
        this.bulkLeft = -1;
        this.args.push(payload.toString('utf8', 0, Math.max(0, payload.length - 2)));
        if (--this.argsLeft === 0) {
          const argv = this.args;
          this.args = [];
          onCommand(argv);
        }
        continue;
      }
      const next = this.lines.read(chunk, pos);
      if (next < 0) return;
      pos = next;
      const line = this.lines.line;
      if (this.argsLeft > 0) {
        const length = line[0] === DOLLAR ? lineInteger(line, 1) : NaN;
        if (length >= 0) this.bulkLeft = length + 2;
        else {
          // Redis answers a protocol error and closes the connection: forget the broken command.
          this.argsLeft = 0;
          this.args = [];
        }
      } else if (line[0] === STAR) {
        // `*0` and `*-1` are skipped by Redis without a reply, so they are no command here either.
        const count = lineInteger(line, 1);
        if (count > 0) this.argsLeft = count;
      } else {
        // Inline command: words separated by blanks (Redis also honours quotes; nothing here needs them).
        const argv = line
          .toString('utf8')
          .split(/[ \t]+/)
          .filter((word) => word.length > 0);
        if (argv.length > 0) onCommand(argv);
      }
    }
  }
}

/** An aggregate being scanned: how many values it still holds (Infinity for a RESP3 streamed one). */
interface Aggregate {
  remaining: number;
  /** A RESP3 attribute (`|`): it decorates the value after it and is no value of its parent itself. */
  readonly attribute: boolean;
  /** A RESP3 streamed string (`$?`): `;n` chunks until `;0`. */
  readonly streamedString: boolean;
}

/**
 * Finds where each top-level reply ends in the server's byte stream, without copying payloads.
 * It knows RESP2 and RESP3 (attributes, pushes, streamed strings and aggregates); a line of an
 * unknown type is taken as a one-line value, so the scan stays aligned on lines whatever comes.
 */
class ReplyScanner {
  /** Type byte of the top-level reply being scanned, 0 between replies. */
  topType = 0;
  /** Type byte of the top-level reply `next()` last reported the end of. */
  endedType = 0;
  private readonly lines = new LineReader();
  private readonly stack: Aggregate[] = [];
  /** Payload bytes (and CRLF) still to pass over. */
  private skip = 0;
  /** The payload being passed over is a chunk of a streamed string, not a whole value. */
  private skipIsChunk = false;

  /** Between two top-level replies. */
  get idle(): boolean {
    return this.topType === 0 && this.skip === 0 && this.stack.length === 0 && !this.lines.partial;
  }

  /** Scans from `from`: the offset just after the first top-level reply that ends in `chunk`, or -1 (all of it was consumed). */
  next(chunk: Buffer, from: number): number {
    let pos = from;
    while (pos < chunk.length) {
      if (this.skip > 0) {
        const take = Math.min(this.skip, chunk.length - pos);
        pos += take;
        this.skip -= take;
        if (this.skip > 0) return -1;
        if (this.skipIsChunk) this.skipIsChunk = false;
        else if (this.valueDone()) return pos;
        continue;
      }
      if (this.idle) this.topType = chunk[pos];
      const next = this.lines.read(chunk, pos);
      if (next < 0) return -1;
      pos = next;
      if (this.onLine(this.lines.line)) return pos;
    }
    return -1;
  }

  /** Handles a header line; true when it completed a top-level reply. */
  private onLine(line: Buffer): boolean {
    const type = line.length > 0 ? String.fromCharCode(line[0]) : '';
    switch (type) {
      case '$': // bulk string
      case '!': // RESP3 bulk error
      case '=': {
        // RESP3 verbatim string
        if (line[1] === QUESTION) {
          this.stack.push({ remaining: Infinity, attribute: false, streamedString: true });
          return false;
        }
        const length = lineInteger(line, 1);
        if (!(length >= 0)) return this.valueDone(); // $-1: null
        this.skip = length + 2;
        return false;
      }
      case '*': // array
      case '~': // RESP3 set
      case '>': // RESP3 push
      case '%': // RESP3 map
      case '|': {
        // RESP3 attribute
        const attribute = type === '|';
        if (line[1] === QUESTION) {
          this.stack.push({ remaining: Infinity, attribute, streamedString: false });
          return false;
        }
        const count = lineInteger(line, 1) * (type === '%' || attribute ? 2 : 1);
        if (!(count > 0)) return attribute ? this.attributeDone() : this.valueDone(); // empty, or *-1: null
        this.stack.push({ remaining: count, attribute, streamedString: false });
        return false;
      }
      case '.': // RESP3 end of a streamed aggregate
        return this.aggregateDone();
      case ';': {
        // RESP3 chunk of a streamed string; `;0` ends it
        const length = lineInteger(line, 1);
        if (length > 0) {
          this.skip = length + 2;
          this.skipIsChunk = true;
          return false;
        }
        return this.aggregateDone();
      }
      default:
        // + - : and RESP3 _ , # ( are one-line values; so is anything unknown.
        return this.valueDone();
    }
  }

  /** The innermost open aggregate ended (streamed end marker): pop it and count it as a value. */
  private aggregateDone(): boolean {
    const done = this.stack.pop();
    if (done?.attribute) return this.attributeDone();
    return this.valueDone();
  }

  /** An attribute ended: the value it decorates comes next, so nothing completed. */
  private attributeDone(): boolean {
    if (this.stack.length === 0) this.topType = 0;
    return false;
  }

  /** A value completed at the current depth; true when that finished a top-level reply. */
  private valueDone(): boolean {
    for (;;) {
      const parent = this.stack[this.stack.length - 1];
      if (parent === undefined) {
        this.endedType = this.topType;
        this.topType = 0;
        return true;
      }
      parent.remaining -= 1;
      if (parent.remaining > 0) return false;
      this.stack.pop();
      if (parent.attribute) return this.attributeDone();
    }
  }
}

type FaultAction =
  | { readonly kind: 'drop'; readonly then: 'reset' | 'stall' }
  | { readonly kind: 'delay'; readonly ms: number; readonly requestMs: number };

interface ArmedFault {
  /** Arming order, to put a fault back in its place when its connection closed too early. */
  readonly seq: number;
  readonly match: CommandMatcher;
  readonly action: FaultAction;
  readonly resolve: (command: SeenCommand) => void;
  readonly reject: (error: Error) => void;
}

/** A mark in a connection's outgoing queue: nothing behind it reaches the client before it is released. */
class Hold {
  released = false;
  timer: NodeJS.Timeout | undefined;

  constructor(
    readonly fault: ArmedFault,
    readonly command: SeenCommand,
  ) {}
}

/** A command on its way to Redis whose reply has not come back yet. */
interface Outstanding {
  readonly command: SeenCommand;
  readonly fault: ArmedFault | undefined;
  /** Its reply starts a stream (SUBSCRIBE, MONITOR, CLIENT REPLY OFF): from there on, replies are not correlated. */
  readonly startsStream: boolean;
  /** Where its delayed reply waits, once its first bytes arrived. */
  hold: Hold | undefined;
}

/** What a connection needs from its proxy. */
interface LinkOwner {
  isBlackholed(): boolean;
  onCommand(link: Link, argv: string[]): void;
  claimFault(command: SeenCommand): ArmedFault | undefined;
  rearm(fault: ArmedFault): void;
  forget(link: Link): void;
}

/** How long a side closed gracefully may take to flush and close before it is destroyed. */
const GRACEFUL_CLOSE_MS = 250;

/** End a socket after what was written to it, and destroy it if it does not close soon. */
function endSoon(socket: Socket): void {
  if (socket.destroyed) return;
  socket.end();
  const timer = setTimeout(() => socket.destroy(), GRACEFUL_CLOSE_MS);
  socket.once('close', () => clearTimeout(timer));
}

/** One client connection and its own connection to Redis. */
class Link {
  /** A connection that sent (P|S)SUBSCRIBE. */
  subscriber = false;
  closed = false;
  private readonly commands = new CommandParser();
  private readonly replies = new ReplyScanner();
  private outstanding: Outstanding[] = [];
  /** Bytes for the client, in order, with the holds of delayed replies among them. */
  private out: (Buffer | Hold)[] = [];
  /** A command that starts a stream was sent: later commands get no correlated replies. */
  private uncorrelatedSent = false;
  /** Replies are passed through as they come, no longer matched to commands. */
  private streaming = false;
  /** A reply was dropped with 'stall': nothing more reaches the client. */
  private stalled = false;
  /** CLIENT REPLY SKIP was sent: the command after it gets no reply. */
  private skipNextReply = false;
  /** A command just parsed is to be held on its way for this long (see `delayReply`'s `requestMs`). */
  private holdRequestMs = 0;
  /** What the client sent while a command is held on its way, in order, and the timer that lets it go. */
  private inbound: Buffer[] = [];
  private inboundTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly id: number,
    private readonly client: Socket,
    private readonly server: Socket,
    private readonly owner: LinkOwner,
  ) {
    for (const socket of [client, server]) {
      socket.setNoDelay(true);
      // Resets and the like are part of what this proxy is for: never let one throw.
      socket.on('error', () => this.destroy());
      socket.on('drain', () => this.updateFlow());
    }
    client.on('data', (chunk: Buffer) => this.fromClient(chunk));
    server.on('data', (chunk: Buffer) => this.fromServer(chunk));
    // A side that closed cleanly may have just written its last bytes (+OK to QUIT): let the other
    // side flush them before it closes too. A side that failed takes the other down at once.
    client.on('close', (hadError) => (hadError ? this.destroy() : this.close(server)));
    server.on('close', (hadError) => (hadError ? this.destroy() : this.close(client)));
    this.updateFlow();
  }

  /** Pause reading where writing cannot go on: during a blackhole, or while the other side is full. */
  updateFlow(): void {
    if (this.closed) return;
    const frozen = this.owner.isBlackholed();
    if (frozen || this.server.writableNeedDrain) this.client.pause();
    else this.client.resume();
    if (frozen || this.client.writableNeedDrain) this.server.pause();
    else this.server.resume();
  }

  /** Write what may go to the client now: everything up to the first hold not released yet. */
  flush(): void {
    if (this.closed) return;
    this.client.cork();
    while (this.out.length > 0 && !this.owner.isBlackholed()) {
      const item = this.out[0];
      if (item instanceof Hold) {
        if (!item.released) break;
        item.fault.resolve(item.command);
      } else {
        this.client.write(item);
      }
      this.out.shift();
    }
    this.client.uncork();
    this.updateFlow();
  }

  /** Destroy both sockets now (a reset as the client sees it); unfinished faults are armed again. */
  destroy(): void {
    if (this.finish()) {
      this.client.destroy();
      this.server.destroy();
    }
  }

  /** For the proxy's close: deliver held replies, then end the client's side after them. */
  shutdown(): void {
    for (const item of this.out) {
      if (item instanceof Hold) {
        clearTimeout(item.timer);
        item.released = true;
      }
    }
    this.flush();
    if (this.finish()) {
      this.server.destroy();
      endSoon(this.client);
    }
  }

  private close(other: Socket): void {
    if (this.finish()) endSoon(other);
  }

  /** Bookkeeping of a connection that is closing; false when it already was. */
  private finish(): boolean {
    if (this.closed) return false;
    this.closed = true;
    const unfinished = new Set<ArmedFault>();
    for (const entry of this.outstanding) if (entry.fault) unfinished.add(entry.fault);
    for (const item of this.out) {
      if (item instanceof Hold) {
        clearTimeout(item.timer);
        unfinished.add(item.fault);
      }
    }
    this.outstanding = [];
    this.out = [];
    clearTimeout(this.inboundTimer);
    this.inboundTimer = undefined;
    this.inbound = [];
    this.owner.forget(this);
    for (const fault of unfinished) this.owner.rearm(fault);
    return true;
  }

  private fromClient(chunk: Buffer): void {
    if (this.closed) return;
    // Parse first, so a matching fault is attached before Redis can answer.
    this.commands.feed(chunk, (argv) => this.owner.onCommand(this, argv));
    if (this.closed) return;
    if (this.holdRequestMs > 0 && !this.inboundTimer) {
      // Held on its way: this chunk (with whatever came before the command in it) and all after it.
      this.inboundTimer = setTimeout(() => this.releaseInbound(), this.holdRequestMs);
    }
    this.holdRequestMs = 0;
    if (this.inboundTimer) {
      this.inbound.push(chunk);
      return;
    }
    this.server.write(chunk);
    if (this.server.writableNeedDrain) this.updateFlow();
  }

  /** A command held on its way goes on to Redis, with what the client sent behind it (after any blackhole). */
  private releaseInbound(): void {
    if (this.closed) return;
    if (this.owner.isBlackholed()) {
      this.inboundTimer = setTimeout(() => this.releaseInbound(), 5);
      return;
    }
    this.inboundTimer = undefined;
    for (const chunk of this.inbound.splice(0)) this.server.write(chunk);
    this.updateFlow();
  }

  /** Track a command sent on this connection, with the fault it matched, if any. */
  accept(command: SeenCommand): void {
    const [name = '', sub = '', mode = ''] = command.argv.slice(0, 3).map((arg) => arg.toLowerCase());
    const subscribes = name === 'subscribe' || name === 'psubscribe' || name === 'ssubscribe';
    if (subscribes) this.subscriber = true;
    if (this.uncorrelatedSent) return;
    const clientReply = name === 'client' && sub === 'reply';
    if (clientReply && mode === 'skip') {
      // Neither CLIENT REPLY SKIP nor the command after it gets a reply.
      this.skipNextReply = true;
      return;
    }
    if (this.skipNextReply) {
      this.skipNextReply = false;
      return;
    }
    const startsStream = subscribes || name === 'monitor' || (clientReply && mode === 'off');
    if (startsStream) this.uncorrelatedSent = true;
    const fault = startsStream || this.stalled ? undefined : this.owner.claimFault(command);
    if (fault?.action.kind === 'delay' && fault.action.requestMs > 0) {
      this.holdRequestMs = Math.max(this.holdRequestMs, fault.action.requestMs);
    }
    this.outstanding.push({ command, fault, startsStream, hold: undefined });
  }

  private fromServer(chunk: Buffer): void {
    if (this.closed || this.stalled) return;
    let pos = 0;
    while (pos < chunk.length) {
      if (this.streaming || (this.replies.idle && this.outstanding[0]?.startsStream)) {
        // Push messages follow; nothing is correlated from here on.
        this.streaming = true;
        this.outstanding = [];
        this.out.push(chunk.subarray(pos));
        break;
      }
      const end = this.replies.next(chunk, pos);
      const stop = end < 0 ? chunk.length : end;
      // A RESP3 push answers no command.
      const push = (end < 0 ? this.replies.topType : this.replies.endedType) === PUSH;
      const entry = push ? undefined : this.outstanding[0];
      const segment = chunk.subarray(pos, stop);
      pos = stop;
      const fault = entry?.fault;
      if (entry && fault?.action.kind === 'delay' && !entry.hold) {
        entry.hold = new Hold(fault, entry.command);
        this.out.push(entry.hold);
      }
      if (fault?.action.kind !== 'drop') this.out.push(segment);
      if (end < 0 || !entry) continue;
      this.outstanding.shift();
      if (entry.fault && !this.replyDone(entry, entry.fault)) return;
    }
    this.flush();
  }

  /** The whole reply to a command with a fault has arrived; false when the connection takes no more replies. */
  private replyDone(entry: Outstanding, fault: ArmedFault): boolean {
    if (fault.action.kind === 'delay') {
      const hold = entry.hold;
      if (!hold) return true; // cannot happen: its first bytes created it
      hold.timer = setTimeout(() => {
        hold.timer = undefined;
        hold.released = true;
        this.flush();
      }, fault.action.ms);
      return true;
    }
    fault.resolve(entry.command);
    if (fault.action.then === 'reset') {
      this.flush(); // what came before the dropped reply is not part of the fault
      this.destroy();
    } else {
      // Replies to the commands behind it will never be seen: their faults wait for other commands.
      this.stalled = true;
      for (const later of this.outstanding) if (later.fault) this.owner.rearm(later.fault);
      this.outstanding = [];
      this.flush();
    }
    return false;
  }
}

interface Blackhole {
  readonly thenReset: boolean;
  readonly resolve: () => void;
  timer: NodeJS.Timeout | undefined;
}

export class FaultProxy {
  private readonly links = new Set<Link>();
  private faults: ArmedFault[] = [];
  private seen: SeenCommand[] = [];
  private readonly blackholes = new Set<Blackhole>();
  private connections = 0;
  private armed = 0;
  private listeningPort = 0;
  private closing: Promise<void> | undefined;
  private readonly server: Server;
  /** What the connections call back; kept off the public surface. */
  private readonly owner: LinkOwner;

  private constructor(private readonly targetPort: number) {
    this.owner = {
      isBlackholed: () => this.blackholes.size > 0,
      onCommand: (link, argv) => this.onCommand(link, argv),
      claimFault: (command) => this.claimFault(command),
      rearm: (fault) => this.rearm(fault),
      forget: (link) => this.links.delete(link),
    };
    this.server = createServer((client) => this.accept(client));
    this.server.on('error', () => undefined);
  }

  /** Listen on a free loopback port and forward every connection to 127.0.0.1:`targetPort`. */
  static async start(targetPort: number): Promise<FaultProxy> {
    const proxy = new FaultProxy(targetPort);
    await new Promise<void>((resolve, reject) => {
      proxy.server.once('error', reject);
      proxy.server.listen(0, '127.0.0.1', () => {
        proxy.server.off('error', reject);
        const address = proxy.server.address();
        if (typeof address === 'object' && address) proxy.listeningPort = address.port;
        resolve();
      });
    });
    return proxy;
  }

  get port(): number {
    return this.listeningPort;
  }

  /** `redis://127.0.0.1:${port}` */
  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Client connections open now. */
  get connectionCount(): number {
    return this.links.size;
  }

  /** Every command seen so far (for assertions); `clearLog()` empties it. */
  get log(): readonly SeenCommand[] {
    return this.seen;
  }

  /** Start a new log (an array taken from `log` before keeps what it had). */
  clearLog(): void {
    this.seen = [];
  }

  /**
   * Drop the reply to the next command (on any connection) that `match` accepts, after Redis ran
   * it. Resolves with that command once the reply was dropped. Only one pending fault of each
   * kind at a time per matcher call; calls queue in order.
   */
  dropReply(match: CommandMatcher, options: DropOptions = {}): Promise<SeenCommand> {
    return this.arm(match, { kind: 'drop', then: options.then ?? 'reset' });
  }

  /**
   * Hold the reply to the next matching command for `ms` before delivering it; replies after it on
   * the same connection wait behind it, as they would on a slow TCP link. Resolves once delivered.
   * The time counts from when the whole reply reached the proxy. With `requestMs`, the command
   * itself is held that long on its way to Redis first (with what the client sent in the same
   * chunk before it, and everything after it on the connection).
   */
  delayReply(match: CommandMatcher, ms: number, options: { requestMs?: number } = {}): Promise<SeenCommand> {
    const requestMs = options.requestMs ?? 0;
    for (const [what, value] of [
      ['ms', ms],
      ['requestMs', requestMs],
    ] as const) {
      if (!(value >= 0) || !Number.isFinite(value))
        throw new RangeError(`delayReply: ${what} must be a finite number >= 0, not ${value}`);
    }
    return this.arm(match, { kind: 'delay', ms, requestMs });
  }

  /** Destroy client connections of this kind now (a subscriber is one that sent (P|S)SUBSCRIBE). */
  resetConnections(kind: ConnectionKind = 'all'): number {
    let count = 0;
    for (const link of [...this.links]) {
      if (kind === 'all' || (kind === 'subscriber') === link.subscriber) {
        link.destroy();
        count += 1;
      }
    }
    return count;
  }

  /**
   * For `ms`, nothing passes in either direction on any connection (new connections are accepted
   * but get nothing either); bytes are kept and flow again afterwards, in order, unless
   * `thenReset` is set, in which case every connection is destroyed at the end instead.
   * Bytes wait unread in the sockets, so commands sent meanwhile are logged and matched only
   * when they flow; with `thenReset` they never reach Redis. Blackholes may overlap: flow
   * resumes when the last one ends. `close()` ends a blackhole early (its promise resolves).
   */
  blackhole(ms: number, options: { thenReset?: boolean } = {}): Promise<void> {
    if (this.closing) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const hole: Blackhole = { thenReset: options.thenReset === true, resolve, timer: undefined };
      hole.timer = setTimeout(() => this.endBlackhole(hole), ms);
      this.blackholes.add(hole);
      for (const link of this.links) link.updateFlow();
    });
  }

  /**
   * Cancel pending faults, deliver anything held, stop accepting and destroy every connection.
   * Pending faults reject with `FaultCancelledError` (already handled: no unhandled rejection);
   * held delayed replies are delivered now and their promises resolve; blackholes end and resolve.
   * Resolves when the listening socket and every connection are closed. Calling it again returns
   * the same promise.
   */
  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    const stopped = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const holes = [...this.blackholes];
    this.blackholes.clear();
    for (const hole of holes) {
      clearTimeout(hole.timer);
      hole.resolve();
    }
    for (const fault of this.faults.splice(0)) fault.reject(new FaultCancelledError());
    for (const link of [...this.links]) link.shutdown();
    await stopped;
  }

  private arm(match: CommandMatcher, action: FaultAction): Promise<SeenCommand> {
    let resolve!: (command: SeenCommand) => void;
    let reject!: (error: Error) => void;
    const promise = new Promise<SeenCommand>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // A test may arm a fault that never fires and not await it: its rejection at close() must not
    // surface as unhandled. Whoever awaits the promise still sees the rejection.
    promise.catch(() => undefined);
    const fault: ArmedFault = { seq: ++this.armed, match, action, resolve, reject };
    if (this.closing) fault.reject(new FaultCancelledError());
    else this.faults.push(fault);
    return promise;
  }

  private accept(client: Socket): void {
    if (this.closing) {
      client.on('error', () => undefined);
      client.destroy();
      return;
    }
    const server = connect({ port: this.targetPort, host: '127.0.0.1' });
    const link = new Link(++this.connections, client, server, this.owner);
    this.links.add(link);
  }

  private onCommand(link: Link, argv: string[]): void {
    const command: SeenCommand = Object.freeze({ argv: Object.freeze(argv), connection: link.id });
    this.seen.push(command);
    link.accept(command);
  }

  private claimFault(command: SeenCommand): ArmedFault | undefined {
    for (let i = 0; i < this.faults.length; i++) {
      const fault = this.faults[i];
      let matched: boolean;
      try {
        matched = fault.match(command.argv);
      } catch (error) {
        // A matcher that throws would never match: fail its fault rather than wait forever.
        this.faults.splice(i--, 1);
        fault.reject(error instanceof Error ? error : new Error(String(error)));
        continue;
      }
      if (matched) {
        this.faults.splice(i, 1);
        return fault;
      }
    }
    return undefined;
  }

  private rearm(fault: ArmedFault): void {
    if (this.closing) {
      fault.reject(new FaultCancelledError());
      return;
    }
    const at = this.faults.findIndex((other) => other.seq > fault.seq);
    this.faults.splice(at < 0 ? this.faults.length : at, 0, fault);
  }

  private endBlackhole(hole: Blackhole): void {
    this.blackholes.delete(hole);
    if (hole.thenReset) this.resetConnections('all');
    if (this.blackholes.size === 0) for (const link of [...this.links]) link.flush();
    hole.resolve();
  }
}

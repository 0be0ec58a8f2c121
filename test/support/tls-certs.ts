import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:tls';
import { freePort } from './redis-server';

/** Whether the installed redis-server was built with TLS, and openssl is there to make certificates. */
export function tlsSupport(): { ok: boolean; why: string } {
  const openssl = spawnSync('openssl', ['version'], { encoding: 'utf8' });
  if (openssl.error || openssl.status !== 0) return { ok: false, why: 'openssl is not installed' };
  // A TLS build complains about the missing certificate files; other builds about the directive.
  const probe = spawnSync('redis-server', ['--port', '0', '--tls-port', '1', '--tls-cert-file', '/nonexistent'], {
    encoding: 'utf8',
    timeout: 5_000,
  });
  const output = `${probe.stdout}${probe.stderr}`;
  if (/not supported|Bad directive|unknown/i.test(output) || !/TLS/.test(output)) {
    return { ok: false, why: `redis-server has no TLS support: ${output.trim().split('\n').pop() ?? ''}` };
  }
  return { ok: true, why: '' };
}

/** PEM texts and files of a throwaway PKI, in a temp dir of its own. */
export interface TestPki {
  readonly dir: string;
  /** The CA that signed the server and client certificates. */
  readonly ca: string;
  readonly caFile: string;
  /** The server's certificate (SAN: IP 127.0.0.1, DNS localhost) and key. */
  readonly serverCertFile: string;
  readonly serverKeyFile: string;
  /** A client certificate signed by the CA, and its key. */
  readonly clientCert: string;
  readonly clientKey: string;
  /** A CA that signed nothing here, and a client certificate signed by it. */
  readonly otherCa: string;
  readonly otherClientCert: string;
  readonly otherClientKey: string;
  dispose(): void;
}

/**
 * A CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by it, plus a
 * second CA with a client certificate of its own, made by `openssl` into a fresh temp dir (EC P-256
 * keys: about 50 ms in all). Valid for a day.
 */
export function makeTestPki(): TestPki {
  const dir = mkdtempSync(join(tmpdir(), 'dislock-pki-'));
  const file = (name: string): string => join(dir, name);
  const openssl = (...args: string[]): void => void execFileSync('openssl', args, { stdio: 'ignore' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  const ca = (name: string, cn: string): void =>
    openssl(
      'req',
      '-x509',
      ...ec,
      '-keyout',
      file(`${name}.key`),
      '-out',
      file(`${name}.crt`),
      '-days',
      '1',
      '-subj',
      `/CN=${cn}`,
    );
  const signed = (name: string, cn: string, by: string, extensions: string): void => {
    openssl('req', ...ec, '-keyout', file(`${name}.key`), '-out', file(`${name}.csr`), '-subj', `/CN=${cn}`);
    writeFileSync(file(`${name}.ext`), extensions);
    openssl(
      'x509',
      '-req',
      '-in',
      file(`${name}.csr`),
      '-CA',
      file(`${by}.crt`),
      '-CAkey',
      file(`${by}.key`),
      '-CAcreateserial',
      '-out',
      file(`${name}.crt`),
      '-days',
      '1',
      '-extfile',
      file(`${name}.ext`),
    );
  };
  ca('ca', 'dislock test CA');
  ca('other-ca', 'another CA');
  signed('server', 'localhost', 'ca', 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n');
  signed('client', 'dislock test client', 'ca', 'extendedKeyUsage=clientAuth\n');
  signed('other-client', 'a client of another CA', 'other-ca', 'extendedKeyUsage=clientAuth\n');
  const read = (name: string): string => readFileSync(file(name), 'utf8');
  return {
    dir,
    ca: read('ca.crt'),
    caFile: file('ca.crt'),
    serverCertFile: file('server.crt'),
    serverKeyFile: file('server.key'),
    clientCert: read('client.crt'),
    clientKey: read('client.key'),
    otherCa: read('other-ca.crt'),
    otherClientCert: read('other-client.crt'),
    otherClientKey: read('other-client.key'),
    dispose: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** PING over a TLS socket with the client certificate: true on +PONG. */
function tlsPing(port: number, pki: TestPki, auth: string | undefined): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({
      host: '127.0.0.1',
      port,
      ca: pki.ca,
      cert: pki.clientCert,
      key: pki.clientKey,
      servername: 'localhost',
    });
    let reply = '';
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1_000, () => done(false));
    socket.on('error', () => done(false));
    socket.on('secureConnect', () => socket.write(`${auth ? `AUTH ${auth}\r\n` : ''}PING\r\n`));
    socket.on('data', (chunk) => {
      reply += chunk.toString();
      if (reply.includes('+PONG')) done(true);
      else if (reply.includes('-')) done(false);
    });
  });
}

/**
 * A redis-server that speaks only TLS (`--port 0`: no plain port) and requires client certificates
 * signed by the test CA (`--tls-auth-clients yes`), on a free loopback port.
 */
export class TlsRedisServer {
  private constructor(
    readonly port: number,
    private readonly child: ChildProcess,
    private readonly dir: string,
  ) {}

  /** `args` are added to the command line; `auth` (`password` or `user password`) is what the readiness PING authenticates with. */
  static async start(pki: TestPki, options: { args?: string[]; auth?: string } = {}): Promise<TlsRedisServer> {
    const port = await freePort();
    const dir = mkdtempSync(join(tmpdir(), 'dislock-tls-redis-'));
    const child = spawn(
      'redis-server',
      [
        '--port',
        '0',
        '--tls-port',
        String(port),
        '--tls-cert-file',
        pki.serverCertFile,
        '--tls-key-file',
        pki.serverKeyFile,
        '--tls-ca-cert-file',
        pki.caFile,
        '--tls-auth-clients',
        'yes',
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        dir,
        '--logfile',
        '',
        '--loglevel',
        'warning',
        ...(options.args ?? []),
      ],
      { stdio: 'ignore' },
    );
    child.on('error', () => undefined);
    const server = new TlsRedisServer(port, child, dir);
    const deadline = Date.now() + 10_000;
    while (!(await tlsPing(port, pki, options.auth))) {
      if (Date.now() > deadline || child.exitCode !== null) {
        await server.dispose();
        throw new Error(`TLS redis-server on port ${port} did not come up`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return server;
  }

  async dispose(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
      this.child.kill('SIGKILL');
      await exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

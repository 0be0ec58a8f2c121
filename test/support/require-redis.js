// Stops the test command at once, with the fix, when there is no Redis to test against.
const { spawnSync } = require('node:child_process');

if (process.env.REDIS_URL) process.exit(0);
const probe = spawnSync('redis-server', ['--version'], { encoding: 'utf8' });
if (probe.error || probe.status !== 0) {
  console.error(
    [
      'nestjs-dislock tests need `redis-server` on PATH: they start their own Redis instances on free ports.',
      'Install it, e.g.  sudo apt-get install -y redis-server   (Debian/Ubuntu)',
      '              or  brew install redis                      (macOS)',
      'or point REDIS_URL at a Redis the tests may use (tests that stop or pause Redis still need redis-server).',
    ].join('\n'),
  );
  process.exit(1);
}

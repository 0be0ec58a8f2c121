/**
 * The configuration snippets of docs/topologies.md ("Topologies"), as written there: `npm run
 * typecheck` fails if one of them stops compiling. Never run.
 */
import { Cluster } from 'ioredis';
import { DisLockModule } from 'nestjs-dislock';

export function oneRedis(): unknown {
  return DisLockModule.forRoot({ redis: 'redis://redis.internal:6379' });
}

export function sentinel(): unknown {
  return DisLockModule.forRoot({
    redis: {
      sentinels: [
        { host: 'sentinel-1', port: 26379 },
        { host: 'sentinel-2', port: 26379 },
      ],
      name: 'mymaster',
    },
    replicas: { min: 1, timeout: 50 }, // optional: count an acquisition once a replica has it
  });
}

export function cluster(): unknown {
  const cluster = new Cluster([{ host: 'redis-node-1', port: 6379 }]);
  return DisLockModule.forRoot({ redis: cluster, replicas: { min: 1, timeout: 50 } });
}

export function redlock(): unknown {
  return DisLockModule.forRoot({
    redlock: { nodes: ['redis://redis-a:6379', 'redis://redis-b:6379', 'redis://redis-c:6379'] },
  });
}

export function tlsByUrl(ca: Buffer, cert: Buffer, key: Buffer): unknown {
  return DisLockModule.forRoot({
    redis: { url: 'rediss://dislock:s3cret@redis.internal.example:6380', tls: { ca, cert, key } },
  });
}

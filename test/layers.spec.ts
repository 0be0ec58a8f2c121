/**
 * Every import in lib/ points down a layer and no files import each other in a circle (the
 * layers are in test/support/layers.ts). The checker is tried first on small made-up trees, so
 * that its silence on lib/ means something.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { checkLayers } from './support/layers';

const LAYERS = [['top/'], ['options/'], ['errors/']];

describe('the layer check', () => {
  let root: string;
  const tree = (files: Record<string, string>): string => {
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    return root;
  };

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'dislock-layers-'));
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  it('passes imports that point down or stay in their layer, and ignores specs and packages', () => {
    tree({
      'top/a.ts': "import { b } from './b';\nimport { o } from '../options/o';\nimport 'rxjs';",
      'top/b.ts': "export * from '../errors';",
      'options/o.ts': "export type { E } from '../errors/e';",
      'errors/index.ts': "export * from './e';",
      'errors/e.ts': 'export type E = 1;',
      'errors/e.spec.ts': "import '../top/a';",
    });
    expect(checkLayers(root, LAYERS)).toEqual([]);
  });

  it('fails an import that runs up a layer, a type-only one and an import() type too', () => {
    tree({
      'top/a.ts': '',
      'options/o.ts': "import type { A } from '../top/a';\nexport type T = import('../top/a').A;",
    });
    expect(checkLayers(root, LAYERS)).toEqual([
      'options/o.ts (options/) imports top/a.ts, a layer above it (top/)',
      'options/o.ts (options/) imports top/a.ts, a layer above it (top/)',
    ]);
  });

  it('fails files that import each other, within one layer too', () => {
    tree({ 'top/a.ts': "import '../top/b';", 'top/b.ts': "export * from './a';" });
    expect(checkLayers(root, LAYERS)).toEqual(['circle: top/a.ts, top/b.ts import each other']);
  });

  it('fails a file in no layer and an import that leaves the tree', () => {
    tree({ 'elsewhere/x.ts': "import '../outside';", 'outside.ts': '' });
    const lib = join(root, 'elsewhere');
    expect(checkLayers(lib, LAYERS)).toEqual([
      'x.ts is in no layer: give its folder a place in LAYERS',
      "x.ts imports '../outside', outside lib/",
    ]);
  });
});

describe('lib/', () => {
  it('has every import pointing down and no circle', () => {
    expect(checkLayers(join(__dirname, '..', 'lib'))).toEqual([]);
  });
});

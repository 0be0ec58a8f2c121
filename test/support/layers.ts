/**
 * The layers of lib/: every import of a lib/ file (a type-only one too) must point down, to a
 * file of a lower layer or of its own, and no files may import each other in a circle.
 *
 *   npm run layers                 (this checkout's lib/)
 *   npm run layers -- OTHER/lib    (another's)
 *
 * prints what breaks that and exits 1, or exits 0 (test/layers.spec.ts runs it on lib/ too).
 * Specs (`*.spec.ts`) are left out: they may import whatever they test.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import ts from 'typescript';

/**
 * From the top down; a file belongs to the layer of the longest entry its path (from lib/) starts
 * with. A folder is one layer, except where a file of it is named on its own.
 */
export const LAYERS: readonly (readonly string[])[] = [
  ['index.ts'], // the public API: hands on names from every layer
  ['testing/'], // DisLockTestingModule wraps DisLockModule
  ['module/'], // DisLockModule wires everything below
  ['decorator/'],
  ['integrations/'],
  ['service/'],
  ['store/'], // the Redis, Redlock and memory stores
  ['core/'],
  ['options/'], // read by every layer above
  // The LockStore seam: the `store` option's type and what the watchdog renews through, so it sits
  // below options/ and core/ (it imports nothing).
  ['store/lock-store.interface.ts'],
  ['events/'],
  ['errors/'],
];

/** The layer of `path` (relative to lib/, with `/`): its index in LAYERS, or -1 for none. */
export function layerOf(path: string, layers: readonly (readonly string[])[] = LAYERS): number {
  let found = -1;
  let longest = -1;
  layers.forEach((entries, index) => {
    for (const entry of entries) {
      const matches = entry.endsWith('/') ? path.startsWith(entry) : path === entry;
      if (matches && entry.length > longest) [found, longest] = [index, entry.length];
    }
  });
  return found;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.spec.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

/** Every module specifier of a file: imports and re-exports (type-only ones too), `import()` of either kind. */
export function specifiersOf(fileName: string, text: string): string[] {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, true);
  const found: string[] = [];
  const literal = (node: ts.Node | undefined): void => {
    if (node && ts.isStringLiteralLike(node)) found.push(node.text);
  };
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) literal(node.moduleSpecifier);
    else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      literal(node.moduleReference.expression);
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) literal(node.argument.literal);
    else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      literal(node.arguments[0]);
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

function resolveRelative(from: string, specifier: string): string | undefined {
  const base = resolve(dirname(from), specifier);
  return [base, `${base}.ts`, join(base, 'index.ts')].find((path) => path.endsWith('.ts') && existsSync(path));
}

/** Files that import each other in a loop (Tarjan's strongly connected components of more than one file, or a file importing itself). */
function circles(graph: ReadonlyMap<string, readonly string[]>): string[][] {
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const connect = (file: string): void => {
    index.set(file, counter);
    low.set(file, counter);
    counter += 1;
    stack.push(file);
    onStack.add(file);
    for (const next of graph.get(file) ?? []) {
      if (!index.has(next)) {
        connect(next);
        low.set(file, Math.min(low.get(file) as number, low.get(next) as number));
      } else if (onStack.has(next)) {
        low.set(file, Math.min(low.get(file) as number, index.get(next) as number));
      }
    }
    if (low.get(file) !== index.get(file)) return;
    const component: string[] = [];
    let member: string;
    do {
      member = stack.pop() as string;
      onStack.delete(member);
      component.push(member);
    } while (member !== file);
    if (component.length > 1 || graph.get(file)?.includes(file)) found.push(component.sort());
  };
  for (const file of [...graph.keys()].sort()) if (!index.has(file)) connect(file);
  return found;
}

/** What breaks the layering of the .ts files under `libDir`, one line each; empty when nothing does. */
export function checkLayers(libDir: string, layers: readonly (readonly string[])[] = LAYERS): string[] {
  const root = resolve(libDir);
  const name = (path: string): string => relative(root, path).split(sep).join('/');
  const label = (layer: number): string => layers[layer].join(' ');
  const problems: string[] = [];
  const graph = new Map<string, string[]>();
  for (const file of sourceFiles(root).sort()) {
    const from = name(file);
    const layer = layerOf(from, layers);
    if (layer < 0) problems.push(`${from} is in no layer: give its folder a place in LAYERS`);
    const targets: string[] = [];
    for (const specifier of specifiersOf(file, readFileSync(file, 'utf8'))) {
      if (!specifier.startsWith('.')) continue; // a package
      const target = resolveRelative(file, specifier);
      if (target === undefined) {
        problems.push(`${from} imports '${specifier}', which is no .ts file`);
        continue;
      }
      const to = name(target);
      if (to.startsWith('..')) {
        problems.push(`${from} imports '${specifier}', outside lib/`);
        continue;
      }
      targets.push(to);
      const below = layerOf(to, layers);
      if (layer >= 0 && below >= 0 && below < layer) {
        problems.push(`${from} (${label(layer)}) imports ${to}, a layer above it (${label(below)})`);
      }
    }
    graph.set(from, targets);
  }
  for (const circle of circles(graph)) problems.push(`circle: ${circle.join(', ')} import each other`);
  return problems;
}

if (typeof require !== 'undefined' && require.main === module) {
  const libDir = process.argv[2] ?? join(__dirname, '..', '..', 'lib');
  const problems = checkLayers(libDir);
  for (const problem of problems) console.log(problem);
  console.log(
    problems.length === 0 ? `${libDir}: every import points down` : `${libDir}: ${problems.length} problem(s)`,
  );
  process.exitCode = problems.length === 0 ? 0 : 1;
}

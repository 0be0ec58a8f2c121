export default async function globalTeardown(): Promise<void> {
  await globalThis.__DISLOCK_REDIS__?.dispose();
}

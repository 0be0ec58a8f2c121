export * from './dislock.error';
export * from './lock-not-acquired.error';
export * from './invalid-options.error';
export * from './key-resolution.error';
export * from './redis-unavailable.error';
export * from './lock-lost.error';
export * from './decorator-setup.error';

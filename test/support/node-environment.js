// The jest environment of this suite: jest's node environment, plus the `Symbol.asyncDispose` that
// Node >= 20.4 defines on its main realm but not in the vm context jest 29 runs tests in (without
// it, `await using` and LockHandle's dispose method would not line up inside tests).
const { TestEnvironment } = require('jest-environment-node');

class DisLockTestEnvironment extends TestEnvironment {
  constructor(config, context) {
    super(config, context);
    for (const name of ['dispose', 'asyncDispose']) {
      if (this.global.Symbol[name] === undefined && Symbol[name] !== undefined) {
        Object.defineProperty(this.global.Symbol, name, { value: Symbol[name] });
      }
    }
  }
}

module.exports = DisLockTestEnvironment;

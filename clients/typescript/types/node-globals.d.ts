/**
 * For Node programs compiled without the DOM lib and with `skipLibCheck: false`.
 *
 * Connect (`@connectrpc/connect` 2.x, which this client's types re-export: ConnectError, Code,
 * Interceptor, the raw client) names the fetch API's global `HeadersInit` in its declarations.
 * The DOM lib declares that type; `@types/node` declares `Headers` and `RequestInit` globally but
 * not `HeadersInit`, so such a program fails on Connect's own declaration files
 * ("Cannot find name 'HeadersInit'"). Referencing this file declares it, as Node's (undici's) type:
 *
 *   /// <reference types="@agentruntime/client/node-globals" />
 *
 * (or "types": ["node", "@agentruntime/client/node-globals"] in tsconfig.json). A program with
 * the DOM lib must not reference it: the DOM lib already declares HeadersInit.
 */
declare global {
  type HeadersInit = NonNullable<RequestInit["headers"]>;
}

export {};

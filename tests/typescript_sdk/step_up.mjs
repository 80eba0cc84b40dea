// The official TypeScript SDK's OAuth client against a live Sandstorm, driven by tests/test_oauth_step_up_live.py:
// connect from no token at all (401, discovery, registration, authorization), list the tools, then call a write tool,
// which a read-only connection is refused with 403 insufficient_scope: the SDK asks for the larger scope, and the call
// is made again once it is granted.
//
// The test plays the browser and the staff user. Each authorization URL the SDK opens goes out on stdout as a JSON
// line ({"event": "authorize", "url": ...}); the query of the redirect that answers it comes back as a line on stdin.
// What the client saw goes out as JSON lines too. Usage: node step_up.mjs MCP_URL REDIRECT_URL FILE_TO_WRITE ERA, ERA
// "legacy" (the 2025-11-25 handshake and a session) or a protocol version to pin (2026-07-28: no session).
import { createInterface } from "node:readline";

import { Client, StreamableHTTPClientTransport, UnauthorizedError } from "@modelcontextprotocol/client";

const [serverUrl, redirectUrl, fileName, era] = process.argv.slice(2);
const versionNegotiation = { mode: era === "legacy" ? "legacy" : { pin: era } };
const answers = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (event) => process.stdout.write(`${JSON.stringify(event)}\n`);

// The SDK's OAuthClientProvider, in memory: a confidential client registered dynamically (RFC 7591).
const kept = {};
const provider = {
  get redirectUrl() {
    return redirectUrl;
  },
  get clientMetadata() {
    return {
      client_name: `TypeScript SDK step-up ${era}`,
      redirect_uris: [redirectUrl],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_post",
    };
  },
  clientInformation: () => kept.client,
  saveClientInformation: (client) => {
    kept.client = client;
  },
  tokens: () => kept.tokens,
  saveTokens: (tokens) => {
    kept.tokens = tokens;
  },
  redirectToAuthorization: (url) => say({ event: "authorize", url: url.href }),
  saveCodeVerifier: (verifier) => {
    kept.verifier = verifier;
  },
  codeVerifier: () => kept.verifier,
  saveDiscoveryState: (state) => {
    kept.discovery = state;
  },
  discoveryState: () => kept.discovery,
};

// An authorization ends the request that needed it with UnauthorizedError (the SDK has sent the user to the consent
// page); once the redirect's query is back, the transport exchanges its code, and the request can be made again.
async function authorized(transport, attempt) {
  try {
    return { result: await attempt() };
  } catch (error) {
    if (!(error instanceof UnauthorizedError)) throw error;
    const { value } = await answers.next();
    await transport.finishAuth(new URLSearchParams(value));
    return { authorized: true };
  }
}

// Connecting: a transport starts once, so the connection after the first authorization is a new one.
const connection = () => {
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider });
  return { transport, client: new Client({ name: "sandstorm-step-up", version: "0" }, { versionNegotiation }) };
};
let { transport, client } = connection();
if ((await authorized(transport, () => client.connect(transport))).authorized) {
  ({ transport, client } = connection());
  await client.connect(transport);
}
const listed = await client.listTools();
say({ event: "connected", tools: listed.tools.map((tool) => tool.name), scope: kept.tokens?.scope });

// The write: 403 insufficient_scope, the step-up authorization, then the same call on the same connection.
const write = () => client.callTool({ name: "file_write", arguments: { path: fileName, content: "stepped up\n" } });
let { result } = await authorized(transport, write);
result ??= await write();
const text = result.content.map((block) => block.text ?? "").join("");
say({ event: "called", isError: Boolean(result.isError), text, scope: kept.tokens?.scope });
await client.close();
process.exit(0);

// A real OpenID Connect provider (panva's oidc-provider) for the single sign-on tests, on a loopback
// port of its own. It prints `issuer <URL>` on stdout once it listens, and exits when its standard
// input closes, so that it never outlives the test that started it.
//
// Clients (all confidential, client_secret_basic, PKCE S256 required):
//   recovea          ID tokens signed RS256
//   recovea-es256    ID tokens signed ES256
//   recovea-hs256    ID tokens signed HS256 with the client secret (the relying party must refuse)
//   other-client     another client of the same provider
// Each client's secret is `<client id>-secret`.
//
// Accounts: anyone signs in with any password (devInteractions' login form); the login name picks
// the claims below. `GET /_test/stats` answers how many times the keys (`/jwks`) were fetched.
//
// OIDC_TEST_PROVIDER (JSON, optional) overrides `redirectUris` and `accounts`, for tests that
// need a real console's callback or an organization created in its store. `POST /_test/accounts`
// (a JSON object, as `accounts`) replaces the accounts while it runs: a console's organizations get
// their ids only once the console runs, and the console must know the issuer before it starts.
import { generateKeyPairSync } from 'node:crypto';
import { createServer } from 'node:http';

import Provider from 'oidc-provider';

const overrides = JSON.parse(process.env.OIDC_TEST_PROVIDER || '{}');
const redirectUris = overrides.redirectUris || ['http://127.0.0.1:9/console/oidc/callback'];
let accounts = overrides.accounts || {
  alice: {
    email: 'alice@acme.example', email_verified: true, recovea_org: 'org_acme', recovea_role: 'admin', groups: ['staff'],
  },
  victor: {
    email: 'victor@acme.example', email_verified: true, recovea_org: 'org_acme', recovea_role: 'viewer', groups: [],
  },
  olga: {
    email: 'olga@operator.example', email_verified: true, groups: ['staff', 'recovea-operators'],
  },
  nobody: { email: 'nobody@example.com', email_verified: false, groups: [] },
};

// Keys made at each start: nothing secret is kept in the repository.
const signingKey = (type, options, kid) => ({
  ...generateKeyPairSync(type, options).privateKey.export({ format: 'jwk' }),
  kid,
  use: 'sig',
});
const jwks = {
  keys: [
    signingKey('rsa', { modulusLength: 2048 }, 'rsa-1'),
    signingKey('ec', { namedCurve: 'P-256' }, 'ec-1'),
  ],
};

const client = (clientId, alg) => ({
  client_id: clientId,
  client_secret: `${clientId}-secret`,
  redirect_uris: redirectUris,
  grant_types: ['authorization_code'],
  response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
  id_token_signed_response_alg: alg,
});

let jwksFetches = 0;

const server = createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [
      client('recovea', 'RS256'),
      client('recovea-es256', 'ES256'),
      client('recovea-hs256', 'HS256'),
      client('other-client', 'RS256'),
    ],
    jwks,
    cookies: { keys: ['recovea-oidc-test-cookies'] },
    pkce: { required: () => true, methods: ['S256'] },
    scopes: ['openid', 'email', 'profile', 'recovea'],
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name'],
      recovea: ['recovea_org', 'recovea_role', 'groups'],
    },
    // The relying party reads the claims it maps from the ID token.
    conformIdTokenClaims: false,
    enabledJWA: { idTokenSigningAlgValues: ['RS256', 'ES256', 'HS256'] },
    features: { devInteractions: { enabled: true } },
    async findAccount(ctx, accountId) {
      const claims = accounts[accountId];
      if (!claims) return undefined;
      return {
        accountId,
        async claims() {
          return { sub: accountId, name: accountId, ...claims };
        },
      };
    },
  });
  const handle = provider.callback();
  server.on('request', (req, res) => {
    if (req.method === 'GET' && req.url === '/_test/stats') {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ jwks: jwksFetches }));
      return;
    }
    if (req.method === 'POST' && req.url === '/_test/accounts') {
      let body = '';
      req.on('data', (chunk) => { body += chunk; });
      req.on('end', () => {
        accounts = JSON.parse(body);
        res.statusCode = 204;
        res.end();
      });
      return;
    }
    if (req.url.split('?')[0] === '/jwks') jwksFetches += 1;
    handle(req, res);
  });
  process.stdout.write(`issuer ${issuer}\n`);
});

process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();

//! The rule's specification: named credential shapes that must be withheld, named harmless
//! variables that must pass, and properties of the segment rule.
//!
//! Every value here is fake (`FAKE`, `0123…`, `EXAMPLE`, `hunter2`); the shapes are real. A change
//! of the rule starts here: add the case that motivated it, then make it pass.

use proptest::prelude::*;

use super::names::{HARMLESS_NAMES, HARMLESS_SEGMENTS, SECRET_SEGMENTS, SECRET_SUFFIXES};
use super::*;

/// Names withheld whatever their value.
const CREDENTIAL_NAMES: &[(&str, &str)] = &[
    ("OTEL_EXPORTER_OTLP_HEADERS", "x-honeycomb-team=abc"), // collector credentials, by name
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x"),             // the traces' own headers
    ("OPENAI_API_KEY", "x"),                                // vendor API key, `KEY` segment
    ("ANTHROPIC_API_KEY", "x"),                             // vendor API key
    ("DEEPSEEK_API_KEY", "x"),                              // vendor API key
    ("GEMINI_API_KEY", "x"),                                // vendor API key
    ("openai_api_key", "x"),                                // lower case is the same name
    ("MY_APIKEY", "x"),                                     // `APIKEY` compound segment
    ("SERVICEAPIKEY", "x"),                                 // `APIKEY` as the end of a compound
    ("apiKey", "x"),                                        // camel case: `api`, `Key`
    ("STRIPE_API_KEYS", "x"),                               // plural `KEYS`
    ("AWS_ACCESS_KEY_ID", "x"),                             // half of an AWS key pair
    ("AWS_SECRET_ACCESS_KEY", "x"),                         // the other half
    ("AWS_SESSION_TOKEN", "x"),                             // temporary AWS credentials
    ("AZURE_CLIENT_SECRET", "x"),                           // service principal secret
    ("GITHUB_TOKEN", "x"),                                  // `TOKEN` segment
    ("GH_TOKEN", "x"),                                      // gh CLI
    ("GITHUBTOKEN", "x"),                                   // `TOKEN` as the end of a compound
    ("CI_JOB_TOKEN", "x"),                                  // GitLab CI
    ("npm_config__authToken", "x"),                         // npm config through the environment
    ("NPM_CONFIG__AUTH", "x"),                              // npm basic auth
    ("CARGO_REGISTRY_TOKEN", "x"),                          // crates.io publishing
    ("HF_TOKEN", "x"),                                      // Hugging Face
    ("OAUTH2_REFRESH_TOKEN", "x"),                          // digits split off: `OAUTH`, `2`
    ("SECRET", "x"),                                        // the bare word
    ("DJANGO_SECRET_KEY", "x"),                             // framework signing key
    ("JWT_SECRETS", "x"),                                   // plural `SECRETS`
    ("APPSECRET", "x"),                                     // `SECRET` as the end of a compound
    ("DB_PASSWORD", "x"),                                   // `PASSWORD` segment
    ("PGPASSWORD", "x"),                                    // libpq, compound
    ("MYSQL_PWD", "x"),                                     // MySQL client, `PWD` segment
    ("DB_PWD", "x"),                                        // `_PWD` suffix
    ("SMTP_PASS", "x"),                                     // `_PASS` suffix
    ("MYSQLPASS", "x"),                                     // `PASS` as the end of a compound
    ("REDIS_PASSWD", "x"),                                  // `PASSWD`
    ("ADMIN_PASSWORDS", "x"),                               // plural
    ("GPG_PASSPHRASE", "x"),                                // key passphrase
    ("SSH_KEY_PASSPHRASE", "x"),                            // key passphrase
    ("GOOGLE_APPLICATION_CREDENTIALS", "x"),                // path of a key file
    ("DOCKER_CREDS", "x"),                                  // `CREDS`
    ("PRIVATE_KEY_PATH", "x"),                              // `PRIVATE`, `KEY`
    ("SIGNING_PRIVATEKEY", "x"),                            // `PRIVATEKEY` compound
    ("SSH_AUTH_SOCK", "/run/user/1000/ssh"),                // the ssh agent signs for whoever asks
    ("HTTP_AUTHORIZATION", "x"),                            // a header kept in the environment
    ("SESSION_COOKIE", "x"),                                // browser session
    ("BROWSER_COOKIES", "x"),                               // plural `COOKIES`
    ("GITHUB_PAT", "x"),                                    // personal access token
    ("API_BEARER", "x"),                                    // bearer credential
    ("X_OAUTH_CLIENT", "x"),                                // `OAUTH` segment
    ("vault.token", "x"),                                   // dotted names are segmented too
    ("my-service-password", "x"),                           // dashed names are segmented too
    ("PASSWORD_STORE", "x"), // only `PASSWORD_STORE_*` settings are allowed
];

/// Values withheld whatever the name; every name here passes the name rule on its own.
const CREDENTIAL_VALUES: &[(&str, &str)] = &[
    // known token formats
    ("LLM", "sk-FAKE0123456789abcdefghijklmnop"), // OpenAI legacy key
    (
        "LLM",
        "sk-proj-FAKE0123456789abcdefghij_klmnopqrstuvwxyz0123",
    ), // OpenAI project key
    (
        "LLM",
        "sk-ant-api03-FAKE0123456789abcdefghijklmnopqrstuv-wxyz0123AA",
    ), // Anthropic key
    ("LLM", "sk-0123456789abcdef0123456789abcdef"), // DeepSeek key: hex
    (
        "LLM",
        "sk-or-v1-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ), // OpenRouter
    ("GH", "ghp_FAKE0123456789abcdefghijklmnopqrstuv"), // GitHub personal token
    ("GH", "gho_FAKE0123456789abcdefghijklmnopqrstuv"), // GitHub OAuth token
    ("GH", "ghu_FAKE0123456789abcdefghijklmnopqrstuv"), // GitHub user-to-server token
    ("GH", "ghs_FAKE0123456789abcdefghijklmnopqrstuv"), // GitHub installation token
    ("GH", "ghr_FAKE0123456789abcdefghijklmnopqrstuv"), // GitHub refresh token
    (
        "GH",
        "github_pat_11FAKE0000_FAKE0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST",
    ), // fine-grained
    ("GL", "glpat-FAKE0123456789abcdef"),         // GitLab personal token
    ("GL", "glrt-FAKE0123456789abcdefgh"),        // GitLab runner token
    ("CHAT", "xoxb-1234567890-0987654321-FAKEabcdefghijkl"), // Slack bot token
    ("CHAT", "xoxp-1234567890-0987654321-FAKEabcdefghijkl"), // Slack user token
    ("CHAT", "xoxe-1-FAKE0123456789abcdefghij"),  // Slack config token
    ("CHAT", "xapp-1-A0123456789-0123456789-FAKEabcdef"), // Slack app-level token
    ("MAPS", "AIzaFAKE0123456789abcdefghijklmnopqrstu"), // Google API key
    ("GCLOUD", "ya29.FAKE0123456789abcdefghij-klmnopqrstuv"), // Google OAuth access token
    (
        "MAIL",
        "SG.FAKE0123456789abcdefgh.FAKE0123456789abcdefghijklmnopqrstuvwxyzABC",
    ), // SendGrid
    (
        "DO",
        "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ), // DigitalOcean
    (
        "DO",
        "doo_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ), // DO OAuth
    ("PAY", "sk_live_FAKE0123456789abcdefghij"),  // Stripe secret key
    ("PAY", "sk_test_FAKE0123456789abcdefghij"),  // Stripe test key
    ("PAY", "rk_live_FAKE0123456789abcdefghij"),  // Stripe restricted key
    ("PAY", "rk_test_FAKE0123456789abcdefghij"),  // Stripe test restricted key
    ("PAY", "whsec_FAKE0123456789abcdefghijklmn"), // Stripe webhook signing secret
    ("NPMRC", "npm_FAKE0123456789abcdefghijklmnopqrstuv"), // npm token
    ("HUB", "hf_FAKE0123456789abcdefghijklmnopqrst"), // Hugging Face token
    ("HUB", "hf_FAKEabcdefghijklmnopqrstuvwxyzABCD"), // Hugging Face tokens are often letters only
    (
        "LLM",
        "gsk_FAKE0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKL",
    ), // Groq key
    (
        "LLM",
        "xai-FAKE0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZFAKE0123456789",
    ), // xAI
    ("ML", "r8_FAKE0123456789abcdefghijklmnopqrstuvw"), // Replicate token
    (
        "UPLOAD",
        "pypi-AgEIcHlwaS5vcmcFAKE0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST",
    ), // PyPI
    ("REGISTRY", "dckr_pat_FAKE0123456789abcdefghij"), // Docker Hub token
    (
        "TRACKER",
        "lin_api_FAKE0123456789abcdefghijklmnopqrstuvwxyz",
    ), // Linear key
    ("SHOP", "shpat_0123456789abcdef0123456789abcdef"), // Shopify access token
    ("SHOP", "shpss_0123456789abcdef0123456789abcdef"), // Shopify shared secret
    (
        "API",
        "PMAK-0123456789abcdef01234567-0123456789abcdef0123456789abcdef01",
    ), // Postman key
    ("WIKI", "secret_FAKE0123456789abcdefghijklmnopqrstuvwxyzABC"), // Notion secret
    ("WIKI", "ntn_FAKE0123456789abcdefghijklmnopqrstuvwxyzABCDEF"), // Notion token
    ("MAILER", "key-0123456789abcdef0123456789abcdef"), // Mailgun key
    ("AWS_ID", "AKIAIOSFODNN7EXAMPLE"),           // AWS access key id (AWS's own example)
    ("AWS_ID", "ASIAIOSFODNN7EXAMPLE"),           // AWS temporary key id
    (
        "AGE_IDENTITY",
        "AGE-SECRET-KEY-1QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7LQPZRY9X8GF2TVDW0S3JN54KHCE",
    ), // age
    // quoting and surrounding text do not hide a token
    ("QUOTED", "\"ghp_FAKE0123456789abcdefghijklmnopqrstuv\""), // double-quoted token
    ("QUOTED", "'sk-FAKE0123456789abcdefghijklmnop'"),          // single-quoted token
    ("FLAGS", "--token=glpat-FAKE0123456789abcdef --verbose"),  // token inside a command line
    ("PADDED", "  hf_FAKE0123456789abcdefghijklmnopqrst\n"),    // whitespace around it
    // JOSE
    (
        "ID",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJGQUtFIn0.RkFLRS1zaWduYXR1cmU",
    ), // JWT
    (
        "ID",
        "eyJhbGciOiJSU0EtT0FFUCJ9.RkFLRWtleQ.RkFLRWl2.RkFLRWNpcGhlcnRleHQ.RkFLRXRhZw",
    ), // JWE
    (
        "ID",
        "eyJhbGciOiJkaXIifQ..RkFLRWl2.RkFLRWNpcGhlcnRleHQ.RkFLRXRhZw",
    ), // JWE, direct: no key part
    // URLs
    (
        "DATABASE_URL",
        "postgres://app:hunter2@db.example.com:5432/app",
    ), // password in a DSN
    ("REDIS_URL", "redis://:hunter2@cache.example.com:6379/0"), // password without a user
    (
        "GIT_REMOTE",
        "https://ghp_FAKE0123456789abcdefghijklmnopqrstuv@github.com/o/r.git",
    ), // token user
    (
        "GIT_REMOTE",
        "https://0123456789abcdef0123456789abcdef01234567@github.com/o/r",
    ), // 40-hex token user
    (
        "GIT_REMOTE",
        "https://x-access-token:FAKEtoken123@github.com/o/r",
    ), // token as password
    (
        "GIT_REMOTE",
        "https://oauth2:glpat-FAKE0123456789abcdef@gitlab.com/o/r.git",
    ), // GitLab clone URL
    (
        "MONGO_URL",
        "mongodb+srv://admin:FAKEpass@cluster0.example.net/?retryWrites=true",
    ), // Atlas
    (
        "PROXY_LIST",
        "http://a.example, http://bob:FAKEpw@proxy.example:3128",
    ), // second URL of a list
    (
        "NOTIFY",
        "https://hooks.slack.com/services/T00000000/B00000000/FAKEFAKEFAKEFAKEFAKEFAKE",
    ), // Slack webhook
    (
        "NOTIFY",
        "https://hooks.slack.com/workflows/T00000000/A00000000/123/FAKEabc",
    ), // Slack workflow
    (
        "NOTIFY",
        "https://discord.com/api/webhooks/123456789012345678/FAKE-token_abcdef",
    ), // Discord
    (
        "NOTIFY",
        "https://discordapp.com/api/webhooks/123456789012345678/FAKEtoken",
    ), // old Discord host
    (
        "NOTIFY",
        "https://example.webhook.office.com/webhookb2/FAKE-0000@0000/IncomingWebhook/FAKE",
    ), // Teams
    (
        "NOTIFY",
        "https://api.telegram.org/bot123456789:FAKEabcdefghijklmnop/sendMessage",
    ), // Telegram bot
    (
        "MAPS_URL",
        "https://maps.example.com/api?api_key=FAKE0123456789",
    ), // key as a query parameter
    (
        "FEED",
        "https://example.com/feed?user=a&access_token=FAKEabcdef123",
    ), // OAuth token parameter
    (
        "BLOB",
        "https://acct.blob.core.windows.net/c/f?sv=2022-11-02&sig=FAKEsignature%3D",
    ), // Azure SAS
    (
        "S3_LINK",
        "https://b.s3.amazonaws.com/k?X-Amz-Signature=0123456789abcdef",
    ), // presigned S3 URL
    // connection strings and config text
    (
        "AZURE_STORAGE",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=FAKEkey0123==;EndpointSuffix=core.windows.net",
    ), // storage account
    (
        "SERVICE_BUS",
        "Endpoint=sb://ns.example.net/;SharedAccessKeyName=root;SharedAccessKey=FAKE0123=",
    ), // Service Bus
    (
        "SQLSERVER",
        "Server=db.example.com;Database=app;User Id=sa;Password=hunter2;",
    ), // ADO.NET
    ("ODBC", "DRIVER={PostgreSQL};SERVER=db;UID=app;PWD=hunter2"), // ODBC
    ("NPMRC", "//registry.npmjs.org/:_authToken=FAKE-0000-1111"),  // npmrc line
    (
        "NPMRC",
        "registry=https://r.example.com/\n//r.example.com/:_password=RkFLRXBhc3M=",
    ), // npmrc text
    (
        "NETRC",
        "machine api.example.com login alice password hunter2",
    ), // netrc
    ("NETRC", "default login anonymous password FAKE@example.com"), // netrc default entry
    (
        "JAVA_TOOL_OPTIONS",
        "-Djavax.net.ssl.trustStorePassword=changeit",
    ), // JVM property
    ("CURL_ARGS", "-u bob --data client_secret=FAKEsecret0"),      // secret in arguments
    ("HEADERS", "Cookie: a=1; session_token=FAKEabc123"),          // cookie header
    // authorization values
    ("HEADER", "Bearer FAKE0123456789abcdef"), // bearer token
    ("HEADER", "bearer eyJhbGciOiJIUzI1NiJ9.e30.RkFLRQ"), // bearer JWT, lower case
    ("HEADER", "Basic YWxpY2U6aHVudGVyMi1mYWtl"), // basic auth
    ("HEADER", "Authorization: token FAKE0123abcd"), // a whole header line
    ("HEADER", "Proxy-Authorization: Negotiate FAKE"), // proxy header
    (
        "HEADER",
        "Authorization: Bearer ghp_FAKE0123456789abcdefghijklmnopqrstuv",
    ), // header + token
    ("HEADER", "Token token=FAKEabc123"),      // Rails-style token header
    // base64 `user:password`
    ("BASIC", "YWxpY2U6aHVudGVyMi1mYWtl"), // alice:hunter2-fake
    ("BASIC", "Y2ktYm90OkZBS0UtcGFzcy0xMjM="), // ci-bot:FAKE-pass-123
    // private keys
    (
        "DEPLOY",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE\n-----END OPENSSH PRIVATE KEY-----",
    ), // ssh
    (
        "TLS",
        "-----BEGIN RSA PRIVATE KEY-----\nFAKE\n-----END RSA PRIVATE KEY-----",
    ), // PEM RSA
    ("TLS", "-----BEGIN EC PRIVATE KEY-----\nFAKE"), // truncated PEM is still a key
    ("SIGNING", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nFAKE"), // armored PGP key
];

/// Variables that reach the agent.
const HARMLESS: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"), // search path
    ("HOME", "/home/alice"),                  // home directory
    ("PWD", "/home/alice/src/project"),       // allow-listed: the current directory
    ("OLDPWD", "/home/alice"),                // harmless segment: the previous directory
    ("LANG", "en_US.UTF-8"),                  // locale
    ("LC_ALL", "C.UTF-8"),                    // locale
    ("TERM", "xterm-256color"),               // terminal type
    ("SHELL", "/bin/bash"),                   // login shell
    ("USER", "alice"),                        // user name
    ("EDITOR", "vim"),                        // editor
    ("KEYBOARD_LAYOUT", "us"),                // `KEYBOARD` is not `KEY`
    ("MONKEY", "patch"),                      // `KEY` inside a word
    ("TURNKEY_MODE", "on"),                   // `KEY` inside a word
    ("KEYTIMEOUT", "1"),                      // zsh setting, `KEY` as a prefix
    ("TOKENIZERS_PARALLELISM", "false"),      // Hugging Face tokenizers
    ("SECRETARY_NAME", "Jo"),                 // `SECRET` as a prefix
    ("PASSWORD_STORE_DIR", "/home/alice/.password-store"), // allow-listed `pass` setting
    ("PASSWORD_STORE_CLIP_TIME", "45"),       // allow-listed `pass` setting
    ("GIT_ASKPASS", "/usr/lib/git-core/git-gui--askpass"), // prompt program
    ("SSH_ASKPASS", "/usr/bin/ksshaskpass"),  // prompt program
    ("NO_PROXY_BYPASS", "localhost"),         // `BYPASS` is not `PASS`
    ("COMPASS_THEME", "dark"),                // `COMPASS` is not `PASS`
    ("GIT_AUTHOR_NAME", "Alice"),             // `AUTHOR` is not `AUTH`
    ("XAUTHORITY", "/run/user/1000/xauth"),   // `XAUTHORITY` is not `AUTH`
    ("OPENAI_MAX_TOKENS", "4096"),            // a model limit, not a token
    ("GNOME_KEYRING_CONTROL", "/run/user/1000/keyring"), // `KEYRING` is not `KEY`
    ("PATROL_INTERVAL", "30"),                // `PATROL` is not `PAT`
    ("BRANCH", "sk-1234-add-login-page"),     // a branch, not an `sk-` key
    ("TICKET", "hf_demo"),                    // too short for a Hugging Face token
    ("LOCALE_SK", "sk-SK"),                   // Slovak locale
    ("SLUG", "ghp_short"),                    // too short for a GitHub token
    ("MODEL_ID", "hf_internal_testing/tiny-random-gpt2"), // a model id, not a token
    ("HTTPS_PROXY", "http://proxy.example.com:3128"), // proxy without credentials
    ("GIT_REMOTE", "git@github.com:o/r.git"), // scp-like remote: `git` is a user, no secret
    ("CLONE_URL", "https://git@github.com/o/r.git"), // a short user name
    ("ODD_URL", "https://example.com/a:b@c"), // `@` in the path, not the authority
    ("DOCS", "https://docs.example.com/search?q=api+key&page=2"), // words in a query
    ("HOOK_DOCS", "https://api.slack.com/messaging/webhooks"), // about webhooks, not one
    ("DISCORD_INVITE", "https://discord.com/invite/FAKE"), // not a webhook
    (
        "DBUS_SESSION_BUS_ADDRESS",
        "unix:path=/run/user/1000/bus,guid=0123456789abcdef0123456789abcdef",
    ), // D-Bus
    (
        "LS_COLORS",
        "rs=0:di=01;34:ln=01;36:*.key=01;31:*.tar=01;31",
    ), // colours, even for *.key
    ("NODE_OPTIONS", "--max-old-space-size=4096"), // a flag with a number
    ("RUSTFLAGS", "-C target-cpu=native"),    // compiler flags
    ("CONFIG", "auth=true;cache=on"),         // a boolean switch, not a credential
    ("GREETING", "Bearer of good news"),      // `Bearer` in prose
    ("MODE", "basic"),                        // the word basic
    ("HOSTNAME", "build-host-01"),            // host name
    ("SHLVL", "1"),                           // shell depth
    ("VERSION", "eyJ"),                       // looks like the start of a JWT only
    ("DOTTED", "hello.world.again"),          // three dotted parts, not a JWT
    ("BASE64_NAME", "QWxpY2U="),              // base64 of "Alice": no colon
    ("NOTE", "machine learning is fun"),      // `machine` without a netrc password
    ("EMPTY_KEYLESS", ""),                    // empty value
    ("CARGO_TERM_COLOR", "always"),           // cargo setting
    ("TMUX", "/tmp/tmux-1000/default,1234,0"), // tmux socket
    ("PS1", "\\u@\\h:\\w\\$ "),               // prompt with `@` and `:`
    ("SESSION_ID", "0f3c2a"),                 // `SESSION` is not a secret word
    ("KEYMAP", "de-latin1"),                  // console keymap
];

#[test]
fn the_corpus_is_large_enough() {
    assert!(CREDENTIAL_NAMES.len() + CREDENTIAL_VALUES.len() >= 100);
    assert!(HARMLESS.len() >= 50);
}

#[test]
fn credential_names_are_withheld() {
    let missed: Vec<&str> = CREDENTIAL_NAMES
        .iter()
        .filter(|(name, _)| !name_is_credential(name))
        .map(|(name, _)| *name)
        .collect();
    assert!(missed.is_empty(), "not withheld: {missed:?}");
}

#[test]
fn credential_values_are_withheld_by_the_value_rule_alone() {
    let named: Vec<&str> = CREDENTIAL_VALUES
        .iter()
        .filter(|(name, _)| name_is_credential(name))
        .map(|(name, _)| *name)
        .collect();
    assert!(
        named.is_empty(),
        "these names would hide the value rule: {named:?}"
    );
    let missed: Vec<&str> = CREDENTIAL_VALUES
        .iter()
        .filter(|(_, value)| !value_is_credential(value))
        .map(|(_, value)| *value)
        .collect();
    assert!(missed.is_empty(), "not withheld: {missed:#?}");
}

#[test]
fn harmless_variables_pass() {
    let withheld: Vec<(&str, &str)> = HARMLESS
        .iter()
        .filter(|(name, value)| is_credential(name, value))
        .copied()
        .collect();
    assert!(withheld.is_empty(), "withheld: {withheld:#?}");
}

#[test]
fn the_whole_corpus_through_scrub() {
    let withheld = |(name, value): &(&str, &str)| {
        let scrubbed = scrub([(*name, *value)], &[]).unwrap();
        assert_eq!(scrubbed.env.len() + scrubbed.scrubbed.len(), 1);
        !scrubbed.scrubbed.is_empty()
    };
    assert!(
        CREDENTIAL_NAMES
            .iter()
            .chain(CREDENTIAL_VALUES)
            .all(withheld)
    );
    assert!(!HARMLESS.iter().any(withheld));
}

/// A segment that is neither a secret segment nor ends with a secret suffix.
fn plain_segment() -> impl Strategy<Value = String> {
    "[A-Z]{1,10}".prop_filter("plain", |s| {
        !SECRET_SEGMENTS.contains(&s.as_str()) && !SECRET_SUFFIXES.iter().any(|x| s.ends_with(x))
    })
}

fn separator() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("_"), Just("-"), Just(".")]
}

fn not_allow_listed(name: &str) -> bool {
    !HARMLESS_NAMES.iter().any(|allowed| {
        let prefix = allowed.trim_end_matches('*');
        name.to_ascii_uppercase().starts_with(prefix)
    })
}

proptest! {
    #[test]
    fn any_name_with_a_secret_segment_is_withheld(
        before in proptest::collection::vec(plain_segment(), 0..3),
        secret in proptest::sample::select(SECRET_SEGMENTS),
        after in proptest::collection::vec(plain_segment(), 0..3),
        sep in separator(),
        lower in any::<bool>(),
    ) {
        let mut parts = before.clone();
        parts.push(secret.to_owned());
        parts.extend(after);
        let mut name = parts.join(sep);
        if lower {
            name = name.to_ascii_lowercase();
        }
        prop_assume!(not_allow_listed(&name));
        prop_assert!(name_is_credential(&name), "{name}");
    }

    #[test]
    fn any_compound_ending_in_a_secret_suffix_is_withheld(
        head in "[A-Z]{1,6}",
        suffix in proptest::sample::select(SECRET_SUFFIXES),
        rest in proptest::collection::vec(plain_segment(), 0..3),
    ) {
        let compound = format!("{head}{suffix}");
        prop_assume!(!HARMLESS_SEGMENTS.contains(&compound.as_str()));
        let mut parts = vec![compound];
        parts.extend(rest);
        let name = parts.join("_");
        prop_assume!(not_allow_listed(&name));
        prop_assert!(name_is_credential(&name), "{name}");
    }

    #[test]
    fn names_without_secret_segments_and_plain_values_pass(
        parts in proptest::collection::vec(plain_segment(), 1..5),
        // The space keeps the value from being base64 (of a `user:password` by chance).
        value in "[a-z/:. 0-9]{0,20} [a-z/:. 0-9]{0,20}",
    ) {
        let name = parts.join("_");
        prop_assert!(!is_credential(&name, &value), "{name}={value}");
    }

    #[test]
    fn the_rule_is_total_over_any_bytes(
        name in proptest::collection::vec(any::<u8>(), 0..40),
        value in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        use std::os::unix::ffi::OsStrExt;
        let name = OsStr::from_bytes(&name);
        let value = OsStr::from_bytes(&value);
        let _ = is_credential_os(name, value);
        if name.to_str().is_none() {
            prop_assert!(is_credential_os(name, value));
        }
    }
}

//! The store over TLS to a PostgreSQL of the test's own: `initdb` and `postgres` (run as the
//! `postgres` user) with `ssl = on`, a certificate authority made here with `openssl`, a server
//! certificate for `127.0.0.1` and `pg.test` (not `localhost`), and a client certificate. Its
//! `pg_hba.conf` refuses every connection without TLS and asks `certuser` for a certificate. Each
//! `sslmode` connects or is refused as libpq's would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use recovea_store::PostgresStore;
use recovea_store::postgres::Bounds;

/// A PostgreSQL cluster of this test's own, stopped and removed on drop.
struct Cluster {
    dir: PathBuf,
    port: u16,
    server: Child,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// PostgreSQL's programs: this machine has them (the tests need PostgreSQL), and the test fails
/// loudly when they are not there.
fn bin(program: &str) -> PathBuf {
    let found = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's programs in /usr/lib/postgresql")
        .filter_map(|entry| Some(entry.ok()?.path().join("bin").join(program)))
        .filter(|path| path.exists())
        .max();
    found.unwrap_or_else(|| panic!("no {program} under /usr/lib/postgresql/*/bin"))
}

impl Cluster {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("recovea-pg-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).expect("a directory");
        recovea_testkit::pki::issue(&dir.join("certs"), &["IP:127.0.0.1", "DNS:pg.test"], "certuser");
        run(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir));
        let data = dir.join("data");
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data));
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostnossl all all all reject\n\
             hostssl all certuser all cert\n\
             hostssl all all all trust\n",
        )
        .expect("pg_hba.conf");
        let certs = dir.join("certs");
        run(Command::new("chmod").arg("0600").arg(certs.join("server.key")));
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("an address").port()
        };
        let setting = |name: &str, value: &Path| format!("{name}={}", value.display());
        let server = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&dir)
            .args(["-c", "listen_addresses=localhost", "-c", "ssl=on", "-c"])
            .arg(setting("ssl_cert_file", &certs.join("server.pem")))
            .arg("-c")
            .arg(setting("ssl_key_file", &certs.join("server.key")))
            .arg("-c")
            .arg(setting("ssl_ca_file", &certs.join("ca.pem")))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("postgres.log")).expect("a log file"))
            .spawn()
            .expect("postgres starts");
        let cluster = Self { dir, port, server };
        // Ready once it answers on its socket, where a role for the certificate is made.
        let started = Instant::now();
        loop {
            let socket = format!("host={} port={port} user=postgres dbname=postgres", cluster.dir.display());
            match postgres::Client::connect(&socket, postgres::NoTls) {
                Ok(mut client) => {
                    client.batch_execute("CREATE ROLE certuser LOGIN SUPERUSER").expect("a role");
                    break;
                }
                Err(e) => {
                    let log = std::fs::read_to_string(cluster.dir.join("postgres.log")).unwrap_or_default();
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "postgres did not start: {e}\n{log}"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        cluster
    }

    fn cert(&self, name: &str) -> String {
        self.dir.join("certs").join(name).display().to_string()
    }

    fn url(&self, host: &str, user: &str, settings: &str) -> String {
        format!("postgres://{user}@{host}:{}/postgres?{settings}", self.port)
    }
}

const BOUNDS: Bounds = Bounds {
    max_connections: 2,
    pool_wait: Duration::from_millis(1500),
    statement_timeout: Duration::from_secs(5),
};

fn connects(url: &str) -> Result<(), String> {
    let store = PostgresStore::connect_bounded(url, BOUNDS).map_err(|e| e.to_string())?;
    drop(store);
    Ok(())
}

#[test]
fn each_sslmode_connects_or_is_refused_as_libpq_would() {
    let cluster = Cluster::start();
    let (ca, other_ca) = (cluster.cert("ca.pem"), cluster.cert("other-ca.pem"));
    let ok = |host: &str, settings: &str| {
        let url = cluster.url(host, "postgres", settings);
        connects(&url).unwrap_or_else(|e| panic!("{settings} to {host}: {e}"));
    };
    let refused = |host: &str, settings: &str, why: &str| {
        let url = cluster.url(host, "postgres", settings);
        let error = connects(&url).err().unwrap_or_else(|| panic!("{settings} to {host} connected"));
        assert!(error.contains(why), "{settings} to {host}: {error}");
    };

    // The server refuses connections without TLS.
    refused("127.0.0.1", "sslmode=disable", "no encryption");
    ok("127.0.0.1", "sslmode=prefer");
    ok("127.0.0.1", "");
    // `require` encrypts and checks nothing, unless given a root: then it is `verify-ca`.
    ok("localhost", "sslmode=require");
    refused("127.0.0.1", &format!("sslmode=require&sslrootcert={other_ca}"), "UnknownIssuer");
    // `verify-ca`: the chain, not the name.
    ok("localhost", &format!("sslmode=verify-ca&sslrootcert={ca}"));
    refused("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={other_ca}"), "UnknownIssuer");
    // `verify-full`: the chain and the name.
    ok("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca}"));
    refused(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
        "certificate not valid for name \"localhost\"",
    );
    refused("127.0.0.1", "sslmode=verify-full", "needs sslrootcert");
    // The same settings as key=value pairs.
    let pairs = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{ca}'",
        cluster.port
    );
    connects(&pairs).unwrap_or_else(|e| panic!("{pairs}: {e}"));

    // A client certificate, where the server asks for one.
    let as_certuser = |settings: &str| connects(&cluster.url("127.0.0.1", "certuser", settings));
    let verify = format!("sslmode=verify-full&sslrootcert={ca}");
    let error = as_certuser(&verify).expect_err("no certificate, no connection");
    assert!(error.contains("requires a valid client certificate"), "{error}");
    let with_certificate =
        format!("{verify}&sslcert={}&sslkey={}", cluster.cert("client.pem"), cluster.cert("client.key"));
    as_certuser(&with_certificate).unwrap_or_else(|e| panic!("with its certificate: {e}"));
}

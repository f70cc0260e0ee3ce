//! The Redis the counters' tests share: 127.0.0.1:6379 (or `RECOVEA_TEST_REDIS_URL`), a key prefix
//! of each test's own, and its keys deleted when the test ends. Included with `#[path]`.

#![allow(dead_code)]

pub fn redis_url() -> String {
    std::env::var("RECOVEA_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A connection checked with `PING` (the test fails, never skips, without Redis) and a fresh prefix.
pub struct TestRedis {
    pub url: String,
    pub client: redis::Client,
    pub prefix: String,
}

impl TestRedis {
    pub async fn connect() -> Self {
        let url = redis_url();
        let client = redis::Client::open(url.as_str()).expect("redis url");
        let mut connection = client.get_multiplexed_async_connection().await.unwrap_or_else(|e| {
            panic!("these tests need Redis at {url} (redis-server --save '' --appendonly no): {e}")
        });
        redis::cmd("PING").query_async::<()>(&mut connection).await.expect("Redis answers PING");
        let suffix: String = std::iter::repeat_with(fastrand::alphanumeric).take(16).collect();
        Self { url, client, prefix: format!("recovea-test:{suffix}") }
    }

    /// Deletes every key under the prefix, as a flush would.
    pub fn clear(&self) {
        self.try_clear().expect("delete the test's keys");
    }

    fn try_clear(&self) -> redis::RedisResult<()> {
        let mut connection = self.client.get_connection()?;
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{}:*", self.prefix)).query(&mut connection)?;
        if !keys.is_empty() {
            redis::cmd("DEL").arg(keys).query::<i64>(&mut connection)?;
        }
        Ok(())
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.try_clear();
    }
}

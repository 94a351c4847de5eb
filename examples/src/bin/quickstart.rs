//! The README's embedding example: a plain `#[tokio::main]` program that has never heard of
//! actix runs Python in a persistent session and streams its output.

use futures::StreamExt;
use pyvisor::{Engine, EngineConfig, ExecutionEvent};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::start(EngineConfig::default()).await?;
    let session = engine.create_session(Default::default()).await?;
    session.run("import math\nradius = 2").await?;
    let mut execution = session
        .execute("print('area:', math.pi * radius ** 2)")
        .await?;
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Output { data, .. } => print!("{data}"),
            ExecutionEvent::Finished(result) => println!("status: {:?}", result.status),
            _ => {}
        }
    }
    Ok(())
}

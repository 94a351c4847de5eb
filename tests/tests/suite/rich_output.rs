//! Rich output: a pandas DataFrame as final expression carries `text/html`, and matplotlib
//! figures left open become `image/png` displays. (scripts/test.sh installs both packages.)

use pyvisor::ExecutionStatus;
use pyvisor_tests::{run, session};

const TIPS_CSV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/tips.csv");

#[tokio::test]
async fn dataframe_result_carries_html() {
    let (_engine, session) = session().await;
    let code = format!("import pandas as pd\ntips = pd.read_csv({TIPS_CSV:?})\ntips.head(3)");
    let result = run(&session, &code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{:?}", result.error);
    let value = result.result.unwrap();
    assert_eq!(value.type_name, "DataFrame");
    assert!(value.repr.contains("total_bill"), "{}", value.repr);
    let html = value.html.expect("DataFrames carry text/html");
    assert!(html.contains("<table") && html.contains("total_bill"));
    // Later executions see the same DataFrame.
    let rows = run(&session, "len(tips)").await.result.unwrap().repr;
    assert_eq!(rows, "244");
}

#[tokio::test]
async fn open_matplotlib_figures_become_png_displays() {
    let (_engine, session) = session().await;
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')";
    let result = run(&session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{:?}", result.error);
    assert_eq!(result.display.len(), 1);
    assert_eq!(result.display[0].mime, "image/png");
    // base64 of the PNG signature "\x89PNG".
    assert!(result.display[0].data.starts_with("iVBORw0KGgo"));
    // Figures are closed after being shown: the next execution shows nothing.
    assert!(run(&session, "1").await.display.is_empty());
}

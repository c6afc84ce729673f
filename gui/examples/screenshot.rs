//! A screenshot of the whole app, headless: `cargo run -p heapscope-gui --example screenshot -- OUT.png`
//! opens the frag_oom story in its four panes, jumps to the refused 1 GiB request with "Why it failed"
//! showing, and writes the window (1600 x 900) through egui_kittest's wgpu renderer.

use egui::Key;
use egui_kittest::Harness;
use heapscope_gui::HeapscopeApp;
use heapscope_gui::playback::ManualClock;

fn main() -> anyhow::Result<()> {
    let out = std::env::args().nth(1).unwrap_or_else(|| "heapscope-app.png".to_owned());
    let app = HeapscopeApp::new(Box::new(ManualClock::default()));
    let mut harness = Harness::builder()
        .with_size([1600.0, 900.0])
        .with_pixels_per_point(1.0)
        .wgpu()
        .build_ui_state(|ui, app: &mut HeapscopeApp| app.show(ui), app);
    harness.run_steps(2);
    harness.key_press(Key::O);
    harness.run_steps(3);
    let image = harness.render().map_err(|error| anyhow::anyhow!("cannot render: {error}"))?;
    image.save(&out)?;
    println!("wrote {out}");
    Ok(())
}

//! A small SVG writer for the bench charts: elements appended as text, with every attribute
//! value and text node escaped, because target and test names are user input and must not
//! be able to break (or script) the document. No dependency: the charts need a handful of
//! shapes, and the tests parse the output to prove it well-formed.

use std::fmt::Write as _;

/// Sans-serif stack that renders alike on GitHub, browsers and editors.
const FONT_FAMILY: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";

/// How a text node is drawn.
#[derive(Debug, Clone, Copy)]
pub struct TextStyle {
    pub size: f64,
    /// SVG `text-anchor`: `start`, `middle` or `end`.
    pub anchor: &'static str,
    pub bold: bool,
    pub fill: &'static str,
}

impl TextStyle {
    pub const fn new(size: f64) -> TextStyle {
        TextStyle {
            size,
            anchor: "start",
            bold: false,
            fill: "#222222",
        }
    }

    pub const fn anchor(self, anchor: &'static str) -> TextStyle {
        TextStyle { anchor, ..self }
    }

    pub const fn bold(self) -> TextStyle {
        TextStyle { bold: true, ..self }
    }

    pub const fn fill(self, fill: &'static str) -> TextStyle {
        TextStyle { fill, ..self }
    }
}

/// How a line or outline is stroked.
#[derive(Debug, Clone, Copy)]
pub struct Stroke<'a> {
    pub colour: &'a str,
    pub width: f64,
    /// SVG `stroke-dasharray`, e.g. `4 3`.
    pub dash: Option<&'static str>,
}

impl<'a> Stroke<'a> {
    pub const fn new(colour: &'a str, width: f64) -> Stroke<'a> {
        Stroke {
            colour,
            width,
            dash: None,
        }
    }

    pub const fn dashed(self, dash: &'static str) -> Stroke<'a> {
        Stroke {
            dash: Some(dash),
            ..self
        }
    }
}

/// An SVG document being written. Its height is given last, once the layout is known.
pub struct Svg {
    width: f64,
    title: String,
    /// The elements written so far.
    body: String,
}

impl Svg {
    /// Starts a document `width` px wide. `title` becomes the document's `<title>`, which
    /// viewers show as its name and screen readers read out.
    pub fn new(width: f64, title: &str) -> Svg {
        Svg {
            width,
            title: title.to_owned(),
            body: String::new(),
        }
    }

    /// Appends `<name attrs...>text</name>` (or `<name attrs.../>`), escaping every value.
    pub fn element(
        &mut self,
        name: &'static str,
        attrs: &[(&'static str, String)],
        text: Option<&str>,
    ) {
        let _ = write!(self.body, "<{name}");
        for (key, value) in attrs {
            let _ = write!(self.body, " {key}=\"{}\"", escape(value));
        }
        match text {
            Some(text) => {
                let _ = writeln!(self.body, ">{}</{name}>", escape(text));
            }
            None => {
                let _ = writeln!(self.body, "/>");
            }
        }
    }

    /// Opens a group `<g class=...>` whose `tooltip` browsers show on hover (an SVG
    /// `<title>` child); the shapes that follow belong to it until `close_group`.
    pub fn open_group(&mut self, class: &str, tooltip: &str) {
        let _ = writeln!(self.body, "<g class=\"{}\">", escape(class));
        self.element("title", &[], Some(tooltip));
    }

    pub fn close_group(&mut self) {
        let _ = writeln!(self.body, "</g>");
    }

    pub fn rect(&mut self, x: f64, y: f64, width: f64, height: f64, fill: &str) {
        self.element(
            "rect",
            &[
                ("x", num(x)),
                ("y", num(y)),
                ("width", num(width.max(0.0))),
                ("height", num(height.max(0.0))),
                ("fill", fill.to_owned()),
            ],
            None,
        );
    }

    pub fn line(&mut self, from: (f64, f64), to: (f64, f64), stroke: Stroke) {
        let mut attrs = vec![
            ("x1", num(from.0)),
            ("y1", num(from.1)),
            ("x2", num(to.0)),
            ("y2", num(to.1)),
        ];
        attrs.extend(stroke_attrs(stroke));
        self.element("line", &attrs, None);
    }

    /// An open line through `points`; nothing for fewer than two.
    pub fn polyline(&mut self, points: &[(f64, f64)], stroke: Stroke) {
        if points.len() < 2 {
            return;
        }
        let mut attrs = vec![("points", points_attr(points)), ("fill", "none".to_owned())];
        attrs.extend(stroke_attrs(stroke));
        self.element("polyline", &attrs, None);
    }

    /// A filled shape through `points`.
    pub fn polygon(&mut self, points: &[(f64, f64)], fill: &str) {
        let attrs = [("points", points_attr(points)), ("fill", fill.to_owned())];
        self.element("polygon", &attrs, None);
    }

    pub fn circle(&mut self, centre: (f64, f64), radius: f64, fill: &str) {
        let attrs = [
            ("cx", num(centre.0)),
            ("cy", num(centre.1)),
            ("r", num(radius)),
            ("fill", fill.to_owned()),
        ];
        self.element("circle", &attrs, None);
    }

    pub fn text(&mut self, x: f64, y: f64, text: &str, style: TextStyle) {
        let mut attrs = vec![
            ("x", num(x)),
            ("y", num(y)),
            ("font-size", num(style.size)),
            ("fill", style.fill.to_owned()),
        ];
        if style.anchor != "start" {
            attrs.push(("text-anchor", style.anchor.to_owned()));
        }
        if style.bold {
            attrs.push(("font-weight", "bold".to_owned()));
        }
        self.element("text", &attrs, Some(text));
    }

    /// Closes the document, `height` px tall on a white background, and returns its text.
    pub fn finish(self, height: f64) -> String {
        let (w, h) = (num(self.width), num(height));
        let mut head = Svg::new(self.width, "");
        head.rect(0.0, 0.0, self.width, height, "#ffffff");
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"{}\">\n<title>{}</title>\n{}{}</svg>\n",
            escape(FONT_FAMILY),
            escape(&self.title),
            head.body,
            self.body
        )
    }
}

fn stroke_attrs(stroke: Stroke) -> Vec<(&'static str, String)> {
    let mut attrs = vec![
        ("stroke", stroke.colour.to_owned()),
        ("stroke-width", num(stroke.width)),
    ];
    if let Some(dash) = stroke.dash {
        attrs.push(("stroke-dasharray", dash.to_owned()));
    }
    attrs
}

fn points_attr(points: &[(f64, f64)]) -> String {
    let pairs: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{},{}", num(*x), num(*y)))
        .collect();
    pairs.join(" ")
}

/// A coordinate with at most one decimal (a tenth of a pixel is below what anyone sees), and
/// `0` for NaN or infinity so a bad number cannot make the document invalid.
pub fn num(value: f64) -> String {
    if !value.is_finite() {
        return "0".to_owned();
    }
    let text = format!("{value:.1}");
    match text.strip_suffix(".0") {
        Some("-0") => "0".to_owned(),
        Some(whole) => whole.to_owned(),
        None => text,
    }
}

/// Escapes text for an XML text node or a double- or single-quoted attribute. Control
/// characters XML 1.0 forbids even as references become U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "a<b>&c\"d'e</text><script>alert(1)</script>\u{1}";

    #[test]
    fn escapes_markup_in_text_and_attributes() -> anyhow::Result<()> {
        assert_eq!(
            escape("<&>\"'x"),
            "&lt;&amp;&gt;&quot;&apos;x",
            "every markup character"
        );
        let mut svg = Svg::new(100.0, HOSTILE);
        svg.text(1.0, 2.0, HOSTILE, TextStyle::new(10.0));
        svg.element("g", &[("data-name", HOSTILE.to_owned())], None);
        let text = svg.finish(50.0);
        assert!(!text.contains("<script"), "{text}");
        let doc = roxmltree::Document::parse(&text)?;
        let expected = HOSTILE.replace('\u{1}', "\u{FFFD}");
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text") || n.has_tag_name("title"))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(texts, [expected.as_str(), expected.as_str()]);
        let g = doc
            .descendants()
            .find(|n| n.has_tag_name("g"))
            .ok_or_else(|| anyhow::anyhow!("no <g>"))?;
        assert_eq!(g.attribute("data-name"), Some(expected.as_str()));
        assert_eq!(
            doc.descendants()
                .filter(|n| n.has_tag_name("script"))
                .count(),
            0
        );
        Ok(())
    }

    #[test]
    fn numbers_are_short_and_never_nan() {
        assert_eq!(num(12.0), "12");
        assert_eq!(num(12.345), "12.3");
        assert_eq!(num(-0.01), "0");
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(num(f64::INFINITY), "0");
    }

    #[test]
    fn shapes_are_well_formed() -> anyhow::Result<()> {
        let mut svg = Svg::new(10.0, "t");
        svg.line(
            (0.0, 0.0),
            (5.0, 5.0),
            Stroke::new("#000", 1.0).dashed("2 2"),
        );
        svg.polyline(&[(0.0, 0.0)], Stroke::new("#000", 1.0));
        svg.polyline(&[(0.0, 0.0), (1.0, 2.0)], Stroke::new("#000", 1.0));
        svg.polygon(&[(0.0, 0.0), (1.0, 0.0), (0.5, 1.0)], "#123456");
        svg.circle((1.0, 1.0), 2.0, "#654321");
        svg.open_group("bar", "x<y");
        svg.text(1.0, 1.0, "r", TextStyle::new(9.0).anchor("end").bold());
        svg.close_group();
        let text = svg.finish(50.0);
        let doc = roxmltree::Document::parse(&text)?;
        let count = |tag: &str| doc.descendants().filter(|n| n.has_tag_name(tag)).count();
        assert_eq!(count("polyline"), 1, "a one-point polyline is dropped");
        assert_eq!(
            (count("line"), count("polygon"), count("circle")),
            (1, 1, 1)
        );
        let g = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("bar"))
            .ok_or_else(|| anyhow::anyhow!("no group: {text}"))?;
        let tooltip = g.first_element_child().and_then(|t| t.text());
        assert_eq!(tooltip, Some("x<y"));
        assert_eq!(g.children().filter(|n| n.has_tag_name("text")).count(), 1);
        Ok(())
    }
}

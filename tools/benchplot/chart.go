package main

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chart is a grouped bar chart: one group per x label, one bar per series
// in each group, the bar at the median, a whisker from the smallest to the
// largest run, the median written above it.
type chart struct {
	File   string // PNG name in the output directory
	Title  string
	YLabel string
	Note   string // under the x axis: where the figures come from
	Groups []string
	Series []series
	Log    bool // logarithmic y axis (values spanning decades)
	Unit   string
}

type series struct {
	Name  string
	Color color.Color
	Vals  []stat // one per group; N == 0: no bar
}

var palette = []color.Color{
	color.RGBA{0x2f, 0x6f, 0xde, 0xff}, // idem
	color.RGBA{0x9a, 0xa3, 0xb5, 0xff}, // baseline
	color.RGBA{0xe8, 0x89, 0x0c, 0xff},
	color.RGBA{0x1f, 0x8a, 0x4c, 0xff},
	color.RGBA{0x6b, 0x4c, 0xc2, 0xff},
}

// bars draws a chart's series (a plot.Plotter and plot.DataRanger).
type bars struct {
	c     *chart
	floor float64 // where bars start: 0, or below the smallest value on a log axis
}

func (b bars) width() float64 { return 0.8 / float64(len(b.c.Series)) }

func (b bars) center(g, s int) float64 {
	return float64(g) + (float64(s)-float64(len(b.c.Series)-1)/2)*b.width()
}

func (b bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	ymin, ymax = math.Inf(1), 0
	for _, s := range b.c.Series {
		for _, v := range s.Vals {
			if v.N > 0 {
				ymin, ymax = min(ymin, v.Min), max(ymax, v.Max)
			}
		}
	}
	if b.c.Log {
		return -0.5, float64(len(b.c.Groups)) - 0.5, b.floor, ymax * math.Pow(ymax/b.floor, 0.35) // room for the legend
	}
	return -0.5, float64(len(b.c.Groups)) - 0.5, 0, ymax * (1.2 + 0.07*float64(len(b.c.Series)))
}

func (b bars) Plot(c draw.Canvas, p *plot.Plot) {
	tx, ty := p.Transforms(&c)
	label := draw.TextStyle{
		Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(8)),
		XAlign: draw.XCenter, YAlign: draw.YBottom, Handler: plot.DefaultTextHandler,
	}
	whisker := draw.LineStyle{Color: color.RGBA{0x33, 0x33, 0x33, 0xff}, Width: vg.Points(0.8)}
	w := b.width()
	for si, s := range b.c.Series {
		for g, v := range s.Vals {
			if v.N == 0 {
				continue
			}
			x := b.center(g, si)
			x0, x1 := tx(x-w/2*0.92), tx(x+w/2*0.92)
			y0, y1 := ty(b.floor), ty(v.Med)
			c.FillPolygon(s.Color, c.ClipPolygonXY([]vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}))
			top := y1
			if v.N > 1 && v.Max > v.Min {
				xm, cap := tx(x), (x1-x0)/4
				lo, hi := ty(v.Min), ty(v.Max)
				c.StrokeLine2(whisker, xm, lo, xm, hi)
				c.StrokeLine2(whisker, xm-cap, lo, xm+cap, lo)
				c.StrokeLine2(whisker, xm-cap, hi, xm+cap, hi)
				top = max(top, hi)
			}
			c.FillText(label, vg.Point{X: tx(x), Y: top + vg.Points(1.5)}, human(v.Med))
		}
	}
}

// swatch is a legend entry's colour.
type swatch struct{ c color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}}
	c.FillPolygon(s.c, pts)
}

// human formats a rate or a latency compactly: 4.09M, 56.6k, 812, 0.47.
func human(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trim(fmt.Sprintf("%.2f", v/1e6)) + "M"
	case a >= 1e4:
		return trim(fmt.Sprintf("%.1f", v/1e3)) + "k"
	case a >= 1e3:
		return trim(fmt.Sprintf("%.2f", v/1e3)) + "k"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return trim(fmt.Sprintf("%.1f", v))
	default:
		return trim(fmt.Sprintf("%.2f", v))
	}
}

func trim(s string) string {
	for len(s) > 1 && s[len(s)-1] == '0' && containsDot(s) {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

func containsDot(s string) bool {
	for _, r := range s {
		if r == '.' {
			return true
		}
	}
	return false
}

// humanTicks labels a linear axis with human numbers.
type humanTicks struct{}

func (humanTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = human(ts[i].Value)
		}
	}
	return ts
}

// logTicks labels powers of ten (and 2x, 5x) of a log axis.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi*10; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			label := ""
			if m == 1 || hi/lo < 1e3 {
				label = human(v)
			}
			ts = append(ts, plot.Tick{Value: v, Label: label})
		}
	}
	return ts
}

// render draws c into path (PNG).
func render(c *chart, path string) error {
	for _, s := range c.Series {
		if len(s.Vals) != len(c.Groups) {
			return fmt.Errorf("%s: series %s has %d values for %d groups", c.File, s.Name, len(s.Vals), len(c.Groups))
		}
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Title.Padding = vg.Points(12)
	p.Y.Label.Text = c.YLabel
	p.X.Label.Text = c.Note
	p.X.Label.TextStyle.Font.Size = vg.Points(8)
	p.X.Label.TextStyle.Color = color.RGBA{0x55, 0x5c, 0x6b, 0xff}
	p.NominalX(c.Groups...)
	b := bars{c: c}
	if c.Log {
		lo := math.Inf(1)
		for _, s := range c.Series {
			for _, v := range s.Vals {
				if v.N > 0 {
					lo = min(lo, v.Min)
				}
			}
		}
		b.floor = math.Pow(10, math.Floor(math.Log10(lo)))
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	} else {
		p.Y.Tick.Marker = humanTicks{}
	}
	p.Add(b)
	xmin, xmax, ymin, ymax := b.DataRange()
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xmin, xmax, ymin, ymax
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	for _, s := range c.Series {
		p.Legend.Add(s.Name, swatch{s.Color})
	}
	width := vg.Length(math.Max(7, 1.15*float64(len(c.Groups))+2.5)) * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(width, 4.2*vg.Inch), vgimg.UseDPI(150))
	p.Draw(draw.New(img))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

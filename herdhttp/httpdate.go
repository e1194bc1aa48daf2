package herdhttp

import (
	"strings"
	"time"
)

// parseHTTPDate parses an HTTP-date (RFC 9110 §5.6.7) in any of its three
// forms: IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"), the obsolete
// RFC 850 form ("Sunday, 06-Nov-94 08:49:37 GMT") and asctime's ("Sun Nov
// 6 08:49:37 1994"). The grammar is followed to the character, so that a
// value a sender got wrong (a missing comma, a doubled space, a one-digit
// hour, a zone other than GMT) is invalid, as a cache must treat an
// invalid Expires (RFC 9111 §5.3); only the case of names is forgiven.
func parseHTTPDate(s string) (time.Time, bool) {
	return parseHTTPDateIn(strings.TrimSpace(s), time.Now().UTC().Year())
}

// parseHTTPDateIn is parseHTTPDate with the current year given, which a
// two-digit year is read against: more than 50 years ahead of it means
// the century before (RFC 9110 §5.6.7).
func parseHTTPDateIn(s string, year int) (time.Time, bool) {
	switch {
	case len(s) == 29 && s[3] == ',':
		// IMF-fixdate: day-name "," SP day SP month SP year SP time SP "GMT"
		if !dayName(s[:3]) || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' || s[16] != ' ' || s[25] != ' ' || !strings.EqualFold(s[26:], "GMT") {
			return time.Time{}, false
		}
		return makeDate(digits(s[12:16]), month(s[8:11]), digits(s[5:7]), s[17:25])
	case len(s) == 24 && s[3] == ' ':
		// asctime: day-name SP month SP (2DIGIT / SP DIGIT) SP time SP year
		if !dayName(s[:3]) || s[7] != ' ' || s[10] != ' ' || s[19] != ' ' {
			return time.Time{}, false
		}
		day := s[8:10]
		if day[0] == ' ' {
			day = "0" + day[1:]
		}
		return makeDate(digits(s[20:24]), month(s[4:7]), digits(day), s[11:19])
	}
	// RFC 850: day-name-l "," SP day "-" month "-" 2DIGIT SP time SP "GMT"
	name, rest, ok := strings.Cut(s, ", ")
	if !ok || !longDayName(name) || len(rest) != 22 || rest[2] != '-' || rest[6] != '-' || rest[9] != ' ' || rest[18] != ' ' || !strings.EqualFold(rest[19:], "GMT") {
		return time.Time{}, false
	}
	yy := digits(rest[7:9])
	if yy < 0 {
		return time.Time{}, false
	}
	y := year - year%100 + yy
	if y > year+50 {
		y -= 100
	}
	return makeDate(y, month(rest[3:6]), digits(rest[:2]), rest[10:18])
}

// makeDate assembles a date from its parts (-1 for one that did not
// parse) and its time-of-day, hh:mm:ss; a part out of range (31 Feb,
// 24:00) makes it invalid. A leap second, :60, is taken as the next one.
func makeDate(year, mon, day int, clock string) (time.Time, bool) {
	if len(clock) != 8 || clock[2] != ':' || clock[5] != ':' {
		return time.Time{}, false
	}
	h, m, sec := digits(clock[:2]), digits(clock[3:5]), digits(clock[6:])
	if year < 0 || mon < 1 || day < 1 || h < 0 || h > 23 || m < 0 || m > 59 || sec < 0 || sec > 60 {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(mon), day, h, m, 0, 0, time.UTC)
	if t.Day() != day {
		return time.Time{}, false
	}
	return t.Add(time.Duration(sec) * time.Second), true
}

// digits is the value of s, made of ASCII digits only, or -1.
func digits(s string) int {
	if s == "" {
		return -1
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

var (
	dayNames     = []string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
	longDayNames = []string{"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}
	monthNames   = []string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}
)

func dayName(s string) bool     { return indexFold(dayNames, s) >= 0 }
func longDayName(s string) bool { return indexFold(longDayNames, s) >= 0 }

// month is the number of the month named s, or -1.
func month(s string) int {
	if i := indexFold(monthNames, s); i >= 0 {
		return i + 1
	}
	return -1
}

func indexFold(names []string, s string) int {
	for i, n := range names {
		if strings.EqualFold(n, s) {
			return i
		}
	}
	return -1
}

/// Parses durations as the configuration file writes them: `250ms`, `5s`, `10m`, `12h`, `30d`,
/// or a sum such as `1h30m`. Whole numbers only; no sign.
public enum ConfigDuration {
    public static func parse(_ text: String) -> Duration? {
        var total: Duration = .zero
        var number: Int64? = nil
        var index = text.startIndex
        guard !text.isEmpty else { return nil }
        while index < text.endIndex {
            let c = text[index]
            if let digit = c.wholeNumberValue, c.isASCII {
                let (times10, o1) = (number ?? 0).multipliedReportingOverflow(by: 10)
                let (next, o2) = times10.addingReportingOverflow(Int64(digit))
                if o1 || o2 { return nil }
                number = next
                index = text.index(after: index)
                continue
            }
            guard let value = number else { return nil }
            var unitEnd = index
            while unitEnd < text.endIndex, text[unitEnd].isLetter { unitEnd = text.index(after: unitEnd) }
            let unit = text[index..<unitEnd]
            let seconds: Int64
            switch unit {
            case "ms": total += .milliseconds(value); number = nil; index = unitEnd; continue
            case "s": seconds = 1
            case "m": seconds = 60
            case "h": seconds = 3600
            case "d": seconds = 86400
            default: return nil
            }
            let (s, overflow) = value.multipliedReportingOverflow(by: seconds)
            if overflow { return nil }
            total += .seconds(s)
            number = nil
            index = unitEnd
        }
        return number == nil ? total : nil
    }

    /// The shortest exact spelling of a duration in the file's syntax (for messages).
    public static func format(_ duration: Duration) -> String {
        let ms = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        for (unit, size) in [("d", Int64(86_400_000)), ("h", 3_600_000), ("m", 60_000), ("s", 1000)] where ms % size == 0 && ms != 0 {
            return "\(ms / size)\(unit)"
        }
        return "\(ms)ms"
    }
}

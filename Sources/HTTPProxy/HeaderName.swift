/// Allocation-free header-name comparisons for the one pass over each header block.
public enum HeaderName {
    private static let keepAlive = ["keep-alive"]
    private static let close = ["close"]
    private static let upgrade = ["upgrade"]

    /// ASCII case-insensitive equality against a lower-case literal of letters, digits and `-`.
    @inline(__always)
    public static func equals(_ name: String, _ lower: String) -> Bool {
        guard name.utf8.count == lower.utf8.count else { return false }
        var a = name.utf8.makeIterator()
        for l in lower.utf8 {
            guard let b = a.next(), (b | 0x20) == l else { return false }
        }
        return true
    }

    /// `equals` for a slice of a value (a trimmed token).
    public static func equals(_ name: Substring, _ lower: String) -> Bool {
        guard name.utf8.count == lower.utf8.count else { return false }
        return zip(name.utf8, lower.utf8).allSatisfy { ($0 | 0x20) == $1 }
    }

    /// ASCII case-insensitive equality for any bytes (only `A`–`Z` fold): cookie names, which
    /// may hold `_` and other characters the `| 0x20` shortcut of `equals` would change.
    static func equalsIgnoringCase(_ text: Substring, _ lower: String) -> Bool {
        guard text.utf8.count == lower.utf8.count else { return false }
        return zip(text.utf8, lower.utf8).allSatisfy { ($0 >= 0x41 && $0 <= 0x5a ? $0 | 0x20 : $0) == $1 }
    }

    /// Whether `name`, folded like `equalsNormalized`, starts with `normalizedLower`.
    @inline(__always)
    static func hasNormalizedPrefix(_ name: String, _ normalizedLower: String) -> Bool {
        hasNormalizedPrefix(bytes: name.utf8, normalizedLower.utf8)
    }

    /// Equality after folding case and `_` to `-` (how identity-header spellings are compared).
    @inline(__always)
    static func equalsNormalized(_ name: String, _ normalizedLower: String) -> Bool {
        name.utf8.count == normalizedLower.utf8.count && hasNormalizedPrefix(name, normalizedLower)
    }

    /// `equalsNormalized` for a name's bytes (a `String`'s UTF-8, or a field in a received head)
    /// against a literal.
    @inline(__always)
    static func equalsNormalized<Name: Collection<UInt8>>(bytes name: Name, _ normalizedLower: StaticString) -> Bool {
        let literal = UnsafeBufferPointer(start: normalizedLower.utf8Start, count: normalizedLower.utf8CodeUnitCount)
        return name.count == literal.count && hasNormalizedPrefix(bytes: name, literal)
    }

    /// The one folding comparison the others are made of.
    @inline(__always)
    static func hasNormalizedPrefix<Name: Collection<UInt8>, Prefix: Collection<UInt8>>(bytes name: Name, _ normalizedLower: Prefix) -> Bool {
        guard name.count >= normalizedLower.count else { return false }
        var a = name.makeIterator()
        for l in normalizedLower {
            guard let b = a.next() else { return false }
            let folded = b == UInt8(ascii: "_") ? UInt8(ascii: "-") : b | 0x20
            guard folded == l else { return false }
        }
        return true
    }

    /// Whether `needle` occurs in `text`, byte for byte (no Foundation, no allocation).
    static func contains(_ text: String, _ needle: String) -> Bool {
        let t = text.utf8, n = needle.utf8
        guard let first = n.first, t.count >= n.count else { return n.isEmpty }
        var i = t.startIndex
        while let start = t[i...].firstIndex(of: first) {
            if t[start...].starts(with: n) { return true }
            i = t.index(after: start)
        }
        return false
    }

    /// `X_Auth-USER` → `x-auth-user`.
    static func normalize(_ name: String) -> String {
        String(decoding: name.utf8.map { $0 == UInt8(ascii: "_") ? UInt8(ascii: "-") : ($0 >= 0x41 && $0 <= 0x5a ? $0 | 0x20 : $0) }, as: UTF8.self)
    }

    /// Comma-separated tokens of a header value, trimmed and lower-cased. The common single
    /// values (`keep-alive`, `close`, `upgrade`) are answered without splitting or allocating.
    static func tokens(_ value: String) -> [String] {
        if equals(value, "keep-alive") { return keepAlive }
        if equals(value, "close") { return close }
        if equals(value, "upgrade") { return upgrade }
        return value.split(separator: ",").compactMap { part in
            let t = part.trimmingSpaces
            return t.isEmpty ? nil : t.lowercased()
        }
    }

    /// `list` with `value`'s tokens after it; a first `Connection` field's tokens are taken as
    /// they are (appending them to an empty list allocated a copy of the shared common ones).
    static func appendTokens(of value: String, to list: inout [String]) {
        if list.isEmpty { list = tokens(value) } else { list += tokens(value) }
    }
}

extension Substring {
    var trimmingSpaces: Substring {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s = s.dropFirst() }
        while let l = s.last, l == " " || l == "\t" { s = s.dropLast() }
        return s
    }
}

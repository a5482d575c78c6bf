import Yams

/// Walks a composed YAML document, checking types and keys, collecting every problem.
///
/// Each accessor returns `nil` (and records a problem) when the value is present but wrong, so
/// the caller keeps the default and carries on: all problems are reported at once.
final class ConfigReader {
    private(set) var problems: [ConfigProblem] = []
    /// Where each key present in the file is (key path → its key's line and column).
    private(set) var locations: [String: ConfigLocation] = [:]

    /// A mapping node with its path, whose keys have been checked against `Key`.
    struct Section<Key: ConfigKey> {
        let path: String
        let mark: Mark?
        private let values: [String: Node]

        init(path: String, mark: Mark?, values: [String: Node]) {
            self.path = path
            self.mark = mark
            self.values = values
        }

        /// The value of `key`, when the file sets it.
        subscript(_ key: Key) -> Node? { values[key.rawValue] }

        /// The key path of `key` in this section (`server.listen`, `routes[0].host`).
        func child(_ key: Key) -> String { path.isEmpty ? key.rawValue : "\(path).\(key.rawValue)" }
    }

    func report(_ path: String, _ mark: Mark?, _ message: String) {
        problems.append(ConfigProblem(.error, path: path, line: mark?.line, column: mark?.column, message: message))
    }

    /// A problem found after reading, at the key `path` (or its nearest enclosing key).
    func report(_ path: String, _ message: String) {
        let location = ConfigLocation.nearest(path, in: locations)
        problems.append(ConfigProblem(.error, path: path, line: location?.line, column: location?.column, message: message))
    }

    func warn(_ path: String, _ mark: Mark?, _ message: String) {
        problems.append(ConfigProblem(.warning, path: path, line: mark?.line, column: mark?.column, message: message))
    }

    /// A problem with `key`'s value: at the value, or at the section when the file does not set it.
    func report<K>(_ section: Section<K>, _ key: K, _ message: String) {
        report(section.child(key), mark(section, key), message)
    }

    /// A doubt about `key`'s value: at the value, or at the section when the file does not set it.
    func warn<K>(_ section: Section<K>, _ key: K, _ message: String) {
        warn(section.child(key), mark(section, key), message)
    }

    /// A key the section needs and lacks (or holds no usable value for): at the section.
    func reportMissing<K>(_ section: Section<K>, _ key: K, _ message: String) {
        report(section.child(key), section.mark, message)
    }

    /// Reads `node` as a mapping whose keys must be among `Key`'s; `nil` when there is no
    /// node, or it is not a mapping (reported). A null node reads as an empty section.
    func section<Key>(_ node: Node?, path: String, keys _: Key.Type) -> Section<Key>? {
        guard let node else { return nil }
        let keys = Key.allCases.map(\.rawValue)
        if case .scalar(let s) = node, s.tag.description.hasSuffix(":null") || s.string.isEmpty || s.string == "~" {
            return Section(path: path, mark: node.mark, values: [:])
        }
        guard case .mapping(let mapping) = node else {
            report(path, node.mark, "expected a mapping of \(keys.joined(separator: ", ")), found \(kind(node))")
            return nil
        }
        var values: [String: Node] = [:]
        for (keyNode, value) in mapping {
            guard let key = keyNode.scalar?.string else {
                report(path, keyNode.mark, "keys must be plain strings")
                continue
            }
            let keyPath = path.isEmpty ? key : "\(path).\(key)"
            guard keys.contains(key) else {
                var message = "unknown key"
                if let guess = Self.closest(to: key, in: keys) { message += " (did you mean '\(guess)'?)" }
                else { message += " (allowed: \(keys.joined(separator: ", ")))" }
                report(keyPath, keyNode.mark, message)
                continue
            }
            values[key] = value
            if let mark = keyNode.mark { locations[keyPath] = ConfigLocation(line: mark.line, column: mark.column) }
        }
        return Section(path: path, mark: node.mark, values: values)
    }

    /// The subsection under `key` of `parent`, read as `section(_:path:keys:)` does.
    func section<K, Key>(_ parent: Section<K>, _ key: K, keys: Key.Type) -> Section<Key>? {
        section(parent[key], path: parent.child(key), keys: keys)
    }

    func string<K>(_ section: Section<K>, _ key: K) -> String? {
        guard let node = section[key] else { return nil }
        guard case .scalar(let scalar) = node, !isNull(scalar) else {
            report(section, key, "expected a string, found \(kind(node))")
            return nil
        }
        return scalar.string
    }

    func bool<K>(_ section: Section<K>, _ key: K) -> Bool? {
        guard let node = section[key] else { return nil }
        guard case .scalar(let scalar) = node, scalar.style == .plain || scalar.style == .any,
              let value = Bool.construct(from: scalar) else {
            report(section, key, "expected true or false, found \(kind(node))")
            return nil
        }
        return value
    }

    func int<K>(_ section: Section<K>, _ key: K, range: ClosedRange<Int>) -> Int? {
        guard let node = section[key] else { return nil }
        guard case .scalar(let scalar) = node, scalar.style == .plain || scalar.style == .any,
              let value = Int(scalar.string) else {
            report(section, key, "expected a whole number, found \(kind(node))")
            return nil
        }
        guard range.contains(value) else {
            report(section, key, "must be between \(range.lowerBound) and \(range.upperBound)")
            return nil
        }
        return value
    }

    func duration<K>(_ section: Section<K>, _ key: K, atLeast minimum: Duration = .milliseconds(1)) -> Duration? {
        guard let text = string(section, key) else { return nil }
        guard let value = ConfigDuration.parse(text) else {
            report(section, key, "'\(text)' is not a duration (use e.g. 250ms, 5s, 10m, 12h, 30d)")
            return nil
        }
        guard value >= minimum else {
            report(section, key, "must be at least \(ConfigDuration.format(minimum))")
            return nil
        }
        return value
    }

    func enumeration<K, E: RawRepresentable & CaseIterable>(_ section: Section<K>, _ key: K, as: E.Type) -> E? where E.RawValue == String {
        guard let text = string(section, key) else { return nil }
        guard let value = E(rawValue: text) else {
            let allowed = E.allCases.map(\.rawValue).joined(separator: " | ")
            report(section, key, "'\(text)' is not one of \(allowed)")
            return nil
        }
        return value
    }

    /// A sequence of strings; each element is passed to `parse`, whose `nil` reports `what`.
    func list<K, T>(_ section: Section<K>, _ key: K, what: String, parse: (String) -> T?) -> [T]? {
        guard let node = section[key] else { return nil }
        return list(node, path: section.child(key), what: what, parse: parse)
    }

    /// A sequence of sequences of strings (`[[a, b], [c]]`), each string passed to `parse`.
    func lists<K, T>(_ section: Section<K>, _ key: K, what: String, parse: (String) -> T?) -> [[T]]? {
        guard let outer = sequence(section, key) else { return nil }
        let inner = outer.enumerated().map { i, node in list(node, path: "\(section.child(key))[\(i)]", what: what, parse: parse) }
        return inner.contains { $0 == nil } ? nil : inner.compactMap { $0 }
    }

    private func list<T>(_ node: Node, path listPath: String, what: String, parse: (String) -> T?) -> [T]? {
        guard case .sequence(let sequence) = node else {
            report(listPath, node.mark, "expected a list, found \(kind(node))")
            return nil
        }
        var out: [T] = []
        var failed = false
        for (i, element) in sequence.enumerated() {
            let path = "\(listPath)[\(i)]"
            guard case .scalar(let scalar) = element, !isNull(scalar) else {
                report(path, element.mark, "expected a string, found \(kind(element))")
                failed = true
                continue
            }
            guard let value = parse(scalar.string) else {
                report(path, element.mark, "'\(scalar.string)' is not \(what)")
                failed = true
                continue
            }
            out.append(value)
        }
        return failed ? nil : out
    }

    /// A file path (non-empty, no NUL). With `required`, a missing key is an error saying what
    /// the file holds.
    func path<K>(_ section: Section<K>, _ key: K, required: String? = nil) -> String? {
        if section[key] == nil {
            if let required { reportMissing(section, key, "is required (\(required))") }
            return nil
        }
        guard let text = string(section, key) else { return nil }
        guard !text.isEmpty, !text.contains("\0") else {
            report(section, key, "is not a file path")
            return nil
        }
        return text
    }

    func sequence<K>(_ section: Section<K>, _ key: K) -> [Node]? {
        guard let node = section[key] else { return nil }
        guard case .sequence(let sequence) = node else {
            report(section, key, "expected a list, found \(kind(node))")
            return nil
        }
        return Array(sequence)
    }

    /// Where `key`'s value is, or the section when the file does not set it.
    func mark<K>(_ section: Section<K>, _ key: K) -> Mark? { section[key]?.mark ?? section.mark }

    private func isNull(_ scalar: Node.Scalar) -> Bool {
        scalar.style == .plain && (scalar.string == "~" || scalar.string == "null" || scalar.string.isEmpty)
    }

    private func kind(_ node: Node) -> String {
        switch node {
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .alias: return "an alias"
        case .scalar(let s): return isNull(s) ? "nothing" : "'\(s.string)'"
        }
    }

    /// The allowed key nearest to a misspelling, if it is close enough to be a typo.
    static func closest(to key: String, in candidates: [String]) -> String? {
        let scored = candidates.map { ($0, editDistance(key.lowercased(), $0)) }.min { $0.1 < $1.1 }
        guard let (best, distance) = scored, distance <= max(2, best.count / 3) else { return nil }
        return best
    }

    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        var previous = Array(0...b.count)
        for i in 1...max(a.count, 1) where !a.isEmpty {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in 1...max(b.count, 1) where !b.isEmpty {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return a.isEmpty ? b.count : previous[b.count]
    }
}

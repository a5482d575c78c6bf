import Yams

/// Walks a composed YAML document, checking types and keys, collecting every problem.
///
/// Each accessor returns `nil` (and records a problem) when the value is present but wrong, so
/// the caller keeps the default and carries on: all problems are reported at once.
final class ConfigReader {
    private(set) var problems: [ConfigProblem] = []
    /// Where each key present in the file is (key path → its key's line and column).
    private(set) var locations: [String: ConfigLocation] = [:]

    /// A mapping node with its path, whose keys have been checked against the allowed set.
    struct Section {
        let path: String
        let mark: Mark?
        let values: [String: Node]
        let keyMarks: [String: Mark]

        func child(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }
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

    /// Reads `node` as a mapping whose keys must be among `keys`.
    func section(_ node: Node?, path: String, keys: [String]) -> Section? {
        guard let node else { return nil }
        if case .scalar(let s) = node, s.tag.description.hasSuffix(":null") || s.string.isEmpty || s.string == "~" {
            return Section(path: path, mark: node.mark, values: [:], keyMarks: [:])
        }
        guard case .mapping(let mapping) = node else {
            report(path, node.mark, "expected a mapping of \(keys.joined(separator: ", ")), found \(kind(node))")
            return nil
        }
        var values: [String: Node] = [:]
        var marks: [String: Mark] = [:]
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
            marks[key] = keyNode.mark
            if let mark = keyNode.mark { locations[keyPath] = ConfigLocation(line: mark.line, column: mark.column) }
        }
        return Section(path: path, mark: node.mark, values: values, keyMarks: marks)
    }

    func string(_ section: Section, _ key: String) -> String? {
        guard let node = section.values[key] else { return nil }
        guard case .scalar(let scalar) = node, !isNull(scalar) else {
            report(section.child(key), node.mark, "expected a string, found \(kind(node))")
            return nil
        }
        return scalar.string
    }

    func bool(_ section: Section, _ key: String) -> Bool? {
        guard let node = section.values[key] else { return nil }
        guard case .scalar(let scalar) = node, scalar.style == .plain || scalar.style == .any,
              let value = Bool.construct(from: scalar) else {
            report(section.child(key), node.mark, "expected true or false, found \(kind(node))")
            return nil
        }
        return value
    }

    func int(_ section: Section, _ key: String, range: ClosedRange<Int>) -> Int? {
        guard let node = section.values[key] else { return nil }
        guard case .scalar(let scalar) = node, scalar.style == .plain || scalar.style == .any,
              let value = Int(scalar.string) else {
            report(section.child(key), node.mark, "expected a whole number, found \(kind(node))")
            return nil
        }
        guard range.contains(value) else {
            report(section.child(key), node.mark, "must be between \(range.lowerBound) and \(range.upperBound)")
            return nil
        }
        return value
    }

    func duration(_ section: Section, _ key: String, atLeast minimum: Duration = .milliseconds(1)) -> Duration? {
        guard let text = string(section, key) else { return nil }
        guard let value = ConfigDuration.parse(text) else {
            report(section.child(key), section.values[key]?.mark, "'\(text)' is not a duration (use e.g. 250ms, 5s, 10m, 12h, 30d)")
            return nil
        }
        guard value >= minimum else {
            report(section.child(key), section.values[key]?.mark, "must be at least \(ConfigDuration.format(minimum))")
            return nil
        }
        return value
    }

    func enumeration<E: RawRepresentable & CaseIterable>(_ section: Section, _ key: String, as: E.Type) -> E? where E.RawValue == String {
        guard let text = string(section, key) else { return nil }
        guard let value = E(rawValue: text) else {
            let allowed = E.allCases.map(\.rawValue).joined(separator: " | ")
            report(section.child(key), section.values[key]?.mark, "'\(text)' is not one of \(allowed)")
            return nil
        }
        return value
    }

    /// A sequence of strings; each element is passed to `parse`, whose `nil` reports `what`.
    func list<T>(_ section: Section, _ key: String, what: String, parse: (String) -> T?) -> [T]? {
        guard let node = section.values[key] else { return nil }
        guard case .sequence(let sequence) = node else {
            report(section.child(key), node.mark, "expected a list, found \(kind(node))")
            return nil
        }
        var out: [T] = []
        var failed = false
        for (i, element) in sequence.enumerated() {
            let path = "\(section.child(key))[\(i)]"
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
    func path(_ section: Section, _ key: String, required: String? = nil) -> String? {
        if section.values[key] == nil {
            if let required { report(section.child(key), section.mark, "is required (\(required))") }
            return nil
        }
        guard let text = string(section, key) else { return nil }
        guard !text.isEmpty, !text.contains("\0") else {
            report(section.child(key), mark(section, key), "is not a file path")
            return nil
        }
        return text
    }

    func sequence(_ section: Section, _ key: String) -> [Node]? {
        guard let node = section.values[key] else { return nil }
        guard case .sequence(let sequence) = node else {
            report(section.child(key), node.mark, "expected a list, found \(kind(node))")
            return nil
        }
        return Array(sequence)
    }

    func mark(_ section: Section, _ key: String) -> Mark? { section.values[key]?.mark ?? section.mark }

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

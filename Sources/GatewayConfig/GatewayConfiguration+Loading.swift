import Yams

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension GatewayConfiguration {
    /// The outcome of loading: the configuration (when there is no error) and every problem.
    public struct LoadResult: Sendable {
        public var configuration: GatewayConfiguration?
        public var problems: [ConfigProblem]
        /// Where each key present in the file is, by key path (`server.listen`).
        public var locations: [String: ConfigLocation] = [:]
        public var errors: [ConfigProblem] { problems.filter { $0.severity == .error } }
        public var warnings: [ConfigProblem] { problems.filter { $0.severity == .warning } }
    }

    /// The top-level sections.
    enum Key: String, ConfigKey {
        case server, apple, session, store, identity, events, tracing, routes
    }

    /// Reads and validates a configuration file. Reads the one file; connects to nothing.
    public static func load(file path: String) -> LoadResult {
        guard let handle = fopen(path, "rb") else {
            return LoadResult(configuration: nil, problems: [ConfigProblem(.error, path: "", message: "cannot read the file: \(String(cString: strerror(errno)))")])
        }
        defer { fclose(handle) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, handle)
            if n <= 0 { break }
            bytes += chunk[0..<n]
            if bytes.count > 4 << 20 {
                return LoadResult(configuration: nil, problems: [ConfigProblem(.error, path: "", message: "the file is larger than 4 MiB")])
            }
        }
        return parse(yaml: String(decoding: bytes, as: UTF8.self))
    }

    /// Parses and validates YAML text: every problem, each with its key path and line:column.
    public static func parse(yaml: String) -> LoadResult {
        let node: Node?
        do {
            node = try Yams.compose(yaml: yaml)
        } catch let error as YamlError {
            return LoadResult(configuration: nil, problems: [Self.problem(from: error)])
        } catch {
            return LoadResult(configuration: nil, problems: [ConfigProblem(.error, path: "", message: "not valid YAML")])
        }
        let r = ConfigReader()
        var config = GatewayConfiguration()
        guard let root = r.section(node ?? Node(""), path: "", keys: Key.self) else {
            return LoadResult(configuration: nil, problems: r.problems)
        }
        // Section by section, in this order: problems are listed as they are found, and a later
        // section may check an earlier one (events needs identity.assertion).
        if let s = r.section(root, .server, keys: Server.Key.self) { config.server.read(s, r) }
        if let s = r.section(root, .apple, keys: Apple.Key.self) { config.apple = Apple(s, r) }
        if let s = r.section(root, .session, keys: Session.Key.self) { config.session.read(s, r) }
        if let s = r.section(root, .store, keys: Store.Key.self) { config.store.read(s, r) }
        if let s = r.section(root, .identity, keys: Identity.Key.self) { config.identity.read(s, r) }
        if let s = r.section(root, .events, keys: Events.Key.self) {
            config.events.read(s, r, assertion: config.identity.assertion)
        }
        if let s = r.section(root, .tracing, keys: Tracing.Key.self) {
            var tracing = Tracing()
            tracing.read(s, r)
            config.tracing = tracing
        }
        config.routes = Route.readAll(root, r, linkURL: config.identity.linkURL)
        config.crossCheck(r, root)
        let ok = !r.problems.contains { $0.severity == .error }
        return LoadResult(configuration: ok ? config : nil, problems: r.problems, locations: r.locations)
    }

    private static func problem(from error: YamlError) -> ConfigProblem {
        switch error {
        case .scanner(_, let problem, let mark, _), .parser(_, let problem, let mark, _), .composer(_, let problem, let mark, _):
            return ConfigProblem(.error, path: "", line: mark.line, column: mark.column, message: "YAML syntax: \(problem)")
        case .duplicatedKeysInMapping(let duplicates, let context):
            return ConfigProblem(.error, path: "", line: context.mark.line, column: context.mark.column,
                                 message: "duplicate key \(duplicates.map { "'\($0)'" }.joined(separator: ", "))")
        default:
            return ConfigProblem(.error, path: "", message: "not valid YAML")
        }
    }
}

import Foundation

/// The held revocations on disk (`store.state_dir`/`held-revocations.jsonl`, mode 0600): one
/// JSON line per change — an entry held, an entry done — each written and fsynced before the
/// caller goes on; emptied once nothing is held; read back at start. The file is locked
/// (`flock`) for the life of the process: two gateways never share one.
final class HeldJournal: @unchecked Sendable {
    enum Line: Codable, Equatable {
        case hold(HeldRevocation)
        case done(Int64)
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    static let fileName = "held-revocations.jsonl"
    let directory: String
    let path: String
    /// Serialises the writes: a `clear` never overtakes a `hold` being written.
    private let lock = NSLock()
    /// -1 once closed.
    private var fd: Int32

    /// Opens (creating) the journal in `directory` and locks it.
    init(directory: String) throws {
        self.directory = directory
        path = (directory as NSString).appendingPathComponent(Self.fileName)
        try Self.check(directory)
        fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Failure(description: "cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            Foundation.close(fd)
            throw Failure(description: "\(directory) is in use by another sessiongate process (each instance needs its own)")
        }
    }

    /// That `directory` is one the gateway's user can write to (`check` runs this: it opens nothing).
    static func check(_ directory: String) throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw Failure(description: "\(directory) is not a directory (create it, writable by the gateway's user)")
        }
        guard access(directory, W_OK | X_OK) == 0 else {
            throw Failure(description: "\(directory) is not writable by the gateway's user (uid \(getuid()))")
        }
    }

    /// The directory from the configuration, else systemd's (`StateDirectory=` sets
    /// `$STATE_DIRECTORY`; the first of a list).
    static func directory(configured: String?, environment: [String: String] = ProcessInfo.processInfo.environment) -> String? {
        configured ?? environment["STATE_DIRECTORY"]?.split(separator: ":").first.map(String.init)
    }

    deinit { close() }

    /// Closes the file, releasing its lock (at shutdown: the next process may take it).
    func close() {
        lock.withLock {
            guard fd >= 0 else { return }
            Foundation.close(fd)
            fd = -1
        }
    }

    /// What is still held: every entry without its `done`, in the order held. A last line cut
    /// short (a crash mid-write) is ignored; the file is rewritten with only what is held.
    func load() throws -> [HeldRevocation] {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var held: [HeldRevocation] = []
        var done: Set<Int64> = []
        let decoder = JSONDecoder()
        for line in data.split(separator: UInt8(ascii: "\n")) where !line.isEmpty {
            switch try? decoder.decode(Line.self, from: Data(line)) {
            case .hold(let entry): held.append(entry)
            case .done(let id): done.insert(id)
            case nil: continue
            }
        }
        let kept = held.filter { !done.contains($0.id) }
        try lock.withLock {
            try truncate()
            for entry in kept { try write(.hold(entry)) }
        }
        return kept
    }

    func append(_ line: Line) throws {
        try lock.withLock { try write(line) }
    }

    /// Empties the file, if `isEmpty` still says nothing is held once the lock is taken.
    func clear(if isEmpty: () -> Bool) throws {
        try lock.withLock {
            guard isEmpty() else { return }
            try truncate()
        }
    }

    private func write(_ line: Line) throws {
        guard fd >= 0 else { throw Failure(description: "\(path) is closed (the gateway is stopping)") }
        var bytes = Array(try JSONEncoder().encode(line))
        bytes.append(UInt8(ascii: "\n"))
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Foundation.write(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw Failure(description: "writing \(path): \(String(cString: strerror(errno)))") }
            offset += n
        }
        guard fsync(fd) == 0 else { throw Failure(description: "fsync \(path): \(String(cString: strerror(errno)))") }
    }

    private func truncate() throws {
        guard ftruncate(fd, 0) == 0, fsync(fd) == 0 else { throw Failure(description: "truncating \(path): \(String(cString: strerror(errno)))") }
    }
}

import Foundation

/// The sending team's own record of which user got which transfer id: `<export file>.mapping.jsonl`
/// beside the file `migrate export` writes, mode 0600, one `{"sub", "target", "transfer_sub"}`
/// per line. The team re-keys its own data export with it (the recipient's copy of the app's
/// data must name users by transfer id, as the transfer file does: TN3159); it never goes to
/// the recipient. It also records the team the export file was made for: a file made for one
/// team is never extended with another team's ids.
final class TransferMapping {
    let path: String
    let target: String
    /// Transfer ids it already holds.
    private var ids = Set<String>()
    private let output: FileHandle

    static func path(beside file: String) -> String { file + ".mapping.jsonl" }

    /// Opens (or creates) the mapping beside `file` for `target`.
    /// - Throws: `MigrationError` when it names another team, or cannot be read or written.
    init(beside file: String, target: String) throws {
        path = Self.path(beside: file)
        self.target = target
        let manager = FileManager.default
        if manager.fileExists(atPath: path) {
            for (number, line) in try TransferLine.lines(of: path) {
                guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any],
                      let id = object["transfer_sub"] as? String, let team = object["target"] as? String else {
                    throw MigrationError("\(path):\(number): not a line of a transfer mapping; refusing to append to it")
                }
                guard team == target else {
                    throw MigrationError("\(file) was made for team \(team) (\(path)), not \(target): write team \(target)'s export to another --out")
                }
                ids.insert(id)
            }
        } else if !manager.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600]) {
            throw MigrationError("\(path): cannot write")
        }
        // It names every user by their sub: readable by its owner only, whoever made it.
        try? manager.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        guard let output = FileHandle(forWritingAtPath: path) else { throw MigrationError("\(path): cannot write") }
        self.output = output
        try output.seekToEnd()
        if let data = manager.contents(atPath: path), let last = data.last, last != UInt8(ascii: "\n") {
            try output.write(contentsOf: Data("\n".utf8))  // edited by hand: end its last line before appending
        }
    }

    deinit { try? output.close() }

    /// Records that `sub` got `transferSubject` (once).
    func add(sub: String, transferSubject: String) throws {
        guard !ids.contains(transferSubject) else { return }
        let object: [String: String] = ["sub": sub, "target": target, "transfer_sub": transferSubject]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        do { try output.write(contentsOf: data + Data("\n".utf8)) } catch { throw MigrationError("\(path): cannot write (\(error))") }
        ids.insert(transferSubject)
    }
}

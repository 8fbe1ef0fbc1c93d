# Writes OUT, a .cpp defining moonrun::server::embedded_web_files() over the bytes of FILES
# (a ;-list of paths under DIR), so the chat page ships inside the binary: no files to
# install, nothing fetched at run time (air-gapped clusters). Run at build time by the
# moonrun_web_files command in CMakeLists.txt: cmake -DDIR=... -DFILES=... -DOUT=... -P this.
set(text "// Generated at build time by cmake/embed_files.cmake from src/server/web/.\n#include \"server/web_ui.h\"\n\nnamespace moonrun::server {\nnamespace {\n")
set(table "")
set(i 0)
foreach(file IN LISTS FILES)
  file(READ ${DIR}/${file} hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR n "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REGEX REPLACE "((0x..,){32})" "\\1\n" bytes "${bytes}")
  string(APPEND text "const unsigned char file${i}[${n} + 1] = {\n${bytes}0};\n")
  string(APPEND table "    {\"${file}\", {file${i}, ${n}}},\n")
  math(EXPR i "${i} + 1")
endforeach()
string(APPEND text "const EmbeddedFile files[] = {\n${table}};\n}  // namespace\n\n"
       "std::span<const EmbeddedFile> embedded_web_files() { return files; }\n\n}  // namespace moonrun::server\n")
file(WRITE ${OUT} "${text}")

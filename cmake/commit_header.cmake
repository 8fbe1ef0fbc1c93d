# Writes OUT, a header defining MOONRUN_GIT_COMMIT as the source tree's commit at build time
# (with "+dirty" when tracked files differ from it), and rewrites it only when that changes,
# so a rebuild after a new commit says which code it is and an unchanged tree recompiles
# nothing. Run by the moonrun_commit_header target: cmake -DSOURCE_DIR=... -DOUT=... -P this.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND commit "+dirty")
  endif()
endif()
set(text "#pragma once\n// Generated at build time by cmake/commit_header.cmake.\n#define MOONRUN_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()

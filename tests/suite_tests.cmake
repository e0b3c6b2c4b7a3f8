# Included by CTest before it runs anything (TEST_INCLUDE_FILES; the SUITE_* variables come from
# the file tests/CMakeLists.txt generates per test binary): lists the binary's tests and adds one
# CTest test per group of at most SUITE_CHUNK tests of one googletest suite, run in one process.
# A test process costs ~0.45 s before its first line runs (Debian's LibTorch loads 286 libraries
# and registers its operators): over 640 one-test processes that was a third of the suite's CPU
# time. Listing the binary when CTest starts, as gtest_discover_tests does, never misses a test.
execute_process(COMMAND "${SUITE_BINARY}" --gtest_list_tests
                WORKING_DIRECTORY "${SUITE_WORKDIR}" OUTPUT_VARIABLE listed
                RESULT_VARIABLE listed_rc TIMEOUT 60)
if(NOT listed_rc EQUAL 0)
  # A test that fails the same way, so that the run says why nothing of this binary ran.
  add_test("${SUITE_NAME}.list_tests" "${SUITE_BINARY}" --gtest_list_tests)
  return()
endif()
string(REPLACE "\n" ";" lines "${listed}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set("tests_${suite}" "")
  elseif(suite AND line MATCHES "^  ([A-Za-z0-9_/]+)")
    list(APPEND "tests_${suite}" "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()

function(suite_test name filter)
  string(REPLACE ";" ":" filter "${filter}")
  add_test("${name}" "${SUITE_BINARY}" "--gtest_filter=${filter}")
  # No SKIP_REGULAR_EXPRESSION: CTest would report a match as skipped whatever the exit code,
  # and a group's output can say both that tests skipped and that others failed. A group whose
  # tests all skip passes (its output lists them).
  set_tests_properties("${name}" PROPERTIES WORKING_DIRECTORY "${SUITE_WORKDIR}"
                       ENVIRONMENT "${SUITE_ENVIRONMENT}" LABELS "${SUITE_LABELS}")
endfunction()

foreach(suite IN LISTS suites)
  list(LENGTH "tests_${suite}" count)
  math(EXPR parts "(${count} + ${SUITE_CHUNK} - 1) / ${SUITE_CHUNK}")
  set(group "")
  set(part 0)
  set(index 0)
  foreach(test IN LISTS "tests_${suite}")
    list(APPEND group "${test}")
    math(EXPR index "${index} + 1")
    list(LENGTH group size)
    if(size EQUAL SUITE_CHUNK OR index EQUAL count)
      math(EXPR part "${part} + 1")
      set(name "${suite}")
      if(parts GREATER 1)
        set(name "${suite}.part${part}of${parts}")
      endif()
      suite_test("${name}" "${group}")
      set(group "")
    endif()
  endforeach()
endforeach()
